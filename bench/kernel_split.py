"""Where a backward's GPU time goes, kernel by kernel: ours and the reference FA4 on the same inputs
(bench/bwd_order.py's shapes and setup), each run ``--calls`` times under torch.profiler after a
warm-up; per kernel name the mean GPU time per backward call. Why: the packed-varlen backward sits
at 0.95 of the reference while the dense causal one is at 0.97-0.99 (session 16); the split says
whether the gap is in the main kernel or in the pre/post passes around it.

    python3 bench/kernel_split.py --shapes varlen-causal,causal-8k [--calls 20] [--out rows.json]
        [--variants '[{"gqa_finish": "last_cta"}]']   # ours again with each set of knob overrides
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import bwd_order  # noqa: E402


def kernel_times(fn, calls: int) -> dict[str, float]:
    """Mean GPU microseconds per call of each kernel ``fn`` launches (``calls`` calls profiled)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            # A kernel event's own duration (the attribute's name moved between torch releases).
            per[ev.name[:90]] += max(getattr(ev, "device_time_total", 0.0), getattr(ev, "self_device_time_total", 0.0))
    return {n: t / calls for n, t in sorted(per.items(), key=lambda kv: -kv[1])}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="varlen-causal,causal-8k")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--det", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--variants", default="[]", help="JSON list of knob overrides of the default config")
    a = ap.parse_args(argv)
    variants = json.loads(a.variants)
    rows = []
    for name in a.shapes.split(","):
        ours, ref, config, flops = bwd_order.setup(name, a.det)
        row = {"name": name, "config": repr(config), "flops": flops,
               "ours": kernel_times(lambda: ours(config), a.calls), "ref": kernel_times(ref, a.calls)}
        sides = ["ours", "ref"]
        for v in variants:
            cfg = bwd_order.variant_config(config, v)
            side = "ours " + ",".join(f"{k}={x}" for k, x in sorted(v.items()))
            row[side] = kernel_times(lambda cfg=cfg: ours(cfg), a.calls)
            sides.append(side)
        rows.append(row)
        print(f"\n{name} ({config})")
        for side in sides:
            total = sum(row[side].values())
            print(f"  {side}: {total:8.1f} us per backward, {flops / total / 1e6:6.1f} TFLOP/s over all kernels")
            for n, t in row[side].items():
                print(f"    {t:8.1f} us  {n}")
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
