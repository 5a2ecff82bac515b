"""Where the tiny problem's forward + backward call spends its time: the host, or the GPU.

    cd bench && python3 host_profile.py [--calls 300] [--shape 1,128,4,128]

host_floor.py splits the call's host side; this asks whether the loop it times is host-bound at
all. Under torch.profiler (CPU and CUDA activity), ``--calls`` calls of ours, then cuDNN's, through
torch.autograd.grad: each kernel's GPU time per call (name, launches per call, us), their sum
against the loop's wall time per call, and the CPU ops with the most self time per call. If the
kernels' sum is near the wall time, the GPU bounds the loop and a leaner host path cannot help.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict


def profile(fn, calls: int, label: str, top: int) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / calls * 1e6
    gpu: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            g = gpu[ev.name[:70]]
            g[0] += 1
            g[1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    total = sum(t for _, t in gpu.values()) / calls
    print(f"{label}: wall {wall:.1f} us a call under the profiler; GPU kernels {total:.1f} us a call")
    for name, (n, t) in sorted(gpu.items(), key=lambda kv: -kv[1][1]):
        print(f"    gpu {t / calls:7.1f} us  x{n / calls:.1f}  {name}")
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    for e in rows:
        print(f"    cpu self {e.self_cpu_time_total / calls:7.1f} us  x{e.count / calls:.1f}  {e.key[:70]}")


def main() -> int:
    import torch

    import fa4

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--shape", default="1,128,4,128")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    b, s, h, d = (int(x) for x in a.shape.split(","))
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    for provider in ("fa4", "cudnn"):
        def fn(provider=provider):
            return torch.autograd.grad(fa4.flash_attn_func(qg, kg, vg, provider=provider, causal=True), (qg, kg, vg), do)
        profile(fn, a.calls, f"{provider} fwd+bwd B{b} S{s} H{h} D{d} causal", a.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
