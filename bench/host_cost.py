"""Host cost per attention call on a tiny problem: ours and the peers, the same loop for each.

    python3 bench/host_cost.py [--calls 2000] [--shape 1,128,4,128]

A problem so small that the GPU work is a few microseconds, so a loop of ``--calls`` calls
followed by one synchronize measures what the host spends per call (argument checks, config
lookup, allocations, launches). Forward alone (no grad), then forward + backward (autograd,
``torch.autograd.grad``). Each loop runs twice after a warm-up (compiles, caches); the lower
is printed, in microseconds per call.
"""

from __future__ import annotations

import argparse
import time


def per_call_us(fn, calls: int) -> float:
    import torch

    best = float("inf")
    for _ in range(2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def warm_per_call_us(fn, calls: int) -> float:
    """per_call_us after 20 warm-up calls (compiles, caches)."""
    for _ in range(20):
        fn()
    return per_call_us(fn, calls)


def failure(e: Exception, width: int = 100) -> str:
    """What a row prints where its loop raised."""
    return f"n/a ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:width]})"


def tiny_parser(doc: str) -> argparse.ArgumentParser:
    """--calls and --shape (batch,seqlen,heads,head_dim) of the tiny problem, as every host-cost script takes them."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--shape", default="1,128,4,128", help="batch,seqlen,heads,head_dim")
    return ap


def tiny_inputs(shape: str):
    """((b, s, h, d), (q, k, v, dO), (q, k, v) requiring grad): bf16 CUDA tensors of the --shape."""
    import torch

    b, s, h, d = (int(x) for x in shape.split(","))
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    return (b, s, h, d), (q, k, v, do), tuple(t.clone().requires_grad_(True) for t in (q, k, v))


def main() -> int:
    ap = tiny_parser(__doc__)
    ap.add_argument("--providers", default="fa4,flash-attn-4,cudnn,fa2")
    ap.add_argument("--profile", action="store_true", help="then cProfile fa4's forward + backward loop (top 30)")
    a = ap.parse_args()
    import torch

    import fa4

    (b, s, h, d), (q, k, v, do), (qg, kg, vg) = tiny_inputs(a.shape)
    print(f"shape B{b} S{s} H{h} D{d} bf16, {a.calls} calls, one sync; us per call (lower of 2 loops)")
    for p in a.providers.split(","):
        def fwd(p=p):
            with torch.no_grad():
                fa4.flash_attn_func(q, k, v, causal=True, provider=p)

        def fwd_bwd(p=p):
            out = fa4.flash_attn_func(qg, kg, vg, causal=True, provider=p)
            torch.autograd.grad(out, (qg, kg, vg), do)

        row = []
        for name, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
            try:
                row.append(f"{name} {warm_per_call_us(fn, a.calls):7.1f}")
            except Exception as e:
                row.append(f"{name} {failure(e, 80)}")
        print(f"{p:13s} " + "  ".join(row), flush=True)
    if a.profile:
        import cProfile
        import pstats

        def fwd_loop():
            with torch.no_grad():
                for _ in range(a.calls):
                    fa4.flash_attn_func(q, k, v, provider="fa4", causal=True)
            torch.cuda.synchronize()

        def fwd_bwd_loop():
            for _ in range(a.calls):
                out = fa4.flash_attn_func(qg, kg, vg, provider="fa4", causal=True)
                torch.autograd.grad(out, (qg, kg, vg), do)
            torch.cuda.synchronize()

        for name, loop in (("fa4 fwd", fwd_loop), ("fa4 fwd+bwd", fwd_bwd_loop)):
            print(f"-- profile: {name}, {a.calls} calls (tottime, top 25)")
            prof = cProfile.Profile()
            prof.runcall(loop)
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        # GPU time per call, to tell a host-bound loop from a GPU-bound one.
        for name, fn in (("fwd", lambda: fa4.flash_attn_func(q, k, v, provider="fa4", causal=True)),
                         ("fwd+bwd", lambda: torch.autograd.grad(fa4.flash_attn_func(qg, kg, vg, provider="fa4", causal=True),
                                                                 (qg, kg, vg), do))):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
                for _ in range(50):
                    fn()
                torch.cuda.synchronize()
            gpu_us = sum(e.device_time_total for e in p.key_averages()) / 50
            print(f"fa4 {name}: GPU kernel time {gpu_us:.1f} us per call (torch.profiler, 50 calls)")
            del start, end
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
