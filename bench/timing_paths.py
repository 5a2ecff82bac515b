"""Does the timing path change the verdict? One shape, each provider timed several ways in one process.

bench_fwd.py (the tuner harness in a worker process) and check_fwd.py (triton do_bench in-process) disagree
on our forward by up to 20% at S=8192 while the SDPA peers agree to 1%: this prints, for each provider,
  harness      providers.harness.measure in this process (CUDA events, L2 flushed per rep)
  harness/cfg  the same with the provider's default config passed explicitly instead of None
  worker       the same measurement through tuner.worker.IsolatedRunner (what bench_fwd.py uses)
  do_bench     triton.testing.do_bench median (what check_fwd.py uses)
  host_us      host time per call (wall time of 50 calls / 50, GPU kept busy)

    python3 bench/timing_paths.py --shapes 8192:64:0,8192:128:0
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fa4.arch import SM90  # noqa: E402
from fa4.problem import Problem  # noqa: E402
from providers.harness import Settings, make_inputs, measure, tflops  # noqa: E402
from providers import get_provider  # noqa: E402
from tuner.worker import IsolatedRunner  # noqa: E402


def host_us(fn, n=50) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main(argv=None) -> int:
    import triton.testing as tt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8192:64:0,8192:128:0", help="S:hd:causal,...")
    ap.add_argument("--providers", default="fa4,flash-attn-4,cudnn")
    args = ap.parse_args(argv)
    settings = Settings()
    rows = []
    with IsolatedRunner() as runner:
        for spec in args.shapes.split(","):
            s, hd, c = (int(x) for x in spec.split(":"))
            prob = Problem.standard(s, hd, causal=bool(c))
            for name in args.providers.split(","):
                p = get_provider(name)
                why = p.available()
                if why:
                    print(f"skip {name}: {why}", flush=True)
                    continue
                cfg = p.default_config(prob, SM90)
                a = measure(p, prob, None, settings)
                b = measure(p, prob, cfg, settings)
                w = runner.run(name, prob, None, settings)
                q, k, v, _ = make_inputs(prob, 1)
                fn = p.make_fwd(prob, None, q, k, v)
                ms = tt.do_bench(fn, warmup=50, rep=300, return_mode="median")
                row = (spec, name, a.tflops, b.tflops, w.tflops, tflops(prob, ms), host_us(fn))
                rows.append(row)
                print("ROW", row, a.reason or "", b.reason or "", w.reason or "", flush=True)
    print("\n| shape | provider | harness | harness/cfg | worker | do_bench | host_us |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join([r[0], r[1]] + [f"{x:.1f}" if x else "-" for x in r[2:]]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
