"""Where a small-batch decode call's time goes: the decode kernel vs the combine kernel vs gaps.

    python3 bench/decode_profile.py [--shapes 1x8192,1x32768,1x131072,4x32768]

Pages of 256, GQA 32/8, hd128, bf16, one new token (bench/bench_decode.py's shapes). For each
shape and a few configs (auto splits; 1 split; smaller tiles with more stages; a split sweep at
tile_n 64): the call's do_bench median (L2 flushed), each kernel's mean device time over 20 calls
(torch.profiler), and K+V TB/s. The difference between the call and the sum of its kernels is
the launch gap between them on the GPU.
"""

from __future__ import annotations

import argparse
import json

import torch

import fa4
from bench_decode import HKV, D, bench_ms, make


def kernel_times(fn, calls: int = 20) -> dict[str, float]:
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        if e.device_time_total > 0:
            out[e.key[:60]] = round(e.device_time_total / calls, 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x8192,1x32768,1x131072,4x32768")
    ap.add_argument("--configs", default="auto;s1;t64k4;t64k6;t32k8")
    ap.add_argument("--sweep64", default="16,24,32,48")
    a = ap.parse_args()
    named = {
        "auto": {}, "s1": {"num_splits": 1},
        "t64k4": {"tile_n": 64, "kv_stages": 4}, "t64k6": {"tile_n": 64, "kv_stages": 6},
        "t32k8": {"tile_n": 32, "kv_stages": 8},
        # The split combine (DecodeConfigSm90.combine), the other knobs at their defaults.
        "kernel": {"combine": "kernel"}, "pdl": {"combine": "pdl"}, "fused": {"combine": "fused"},
    }
    for shape in a.shapes.split(","):
        batch, kv = (int(x) for x in shape.split("x"))
        q, k, v, table, seqlens = make(batch, kv)
        kv_bytes = 2 * batch * kv * HKV * D * 2
        ref = fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table, num_splits=1).float()
        cfgs = [(n, named[n]) for n in a.configs.split(";")]
        cfgs += [(f"t64k4s{s}", {"tile_n": 64, "kv_stages": 4, "num_splits": s}) for s in map(int, filter(None, a.sweep64.split(",")))]
        for name, cfg in cfgs:
            splits = cfg.get("num_splits", 0)
            knobs = {k_: x for k_, x in cfg.items() if k_ != "num_splits"}

            def call(knobs=knobs, splits=splits, args=(q, k, v, seqlens, table)):
                return fa4.flash_attn_with_kvcache(*args[:3], cache_seqlens=args[3], page_table=args[4],
                                                   num_splits=splits, config=knobs or None)
            try:
                err = (call().float() - ref).abs().max().item()
                ms = bench_ms(call)
                kt = kernel_times(call)
            except Exception as e:  # noqa: BLE001
                print(f"PROFILE {shape} {name}: failed {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            row = dict(shape=shape, config=name, us=round(ms * 1e3, 2), tbs=round(kv_bytes / ms / 1e9, 3),
                       kernels_us=kt, kernel_sum_us=round(sum(kt.values()), 2), max_diff_vs_s1=err)
            print("PROFILE " + json.dumps(row), flush=True)
        del q, k, v, table, seqlens
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
