"""One backward of ours and one of the reference FA4, inside a profiler range, for Nsight Compute.

Both run a few times first (JIT compile, warm caches); then cudaProfilerStart, one backward each,
cudaProfilerStop. Under ncu with --profile-from-start off only those launches are profiled:

    ncu --profile-from-start off --clock-control none --set full -o $OUT/bwd \\
        python3 bench/profile_bwd.py --seqlen 8192 --hdim 128 --causal [--config JSON]

The same inputs for both (16k tokens, heads*hd = 2048, bf16), as check_bwd.py's timing table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

import fa4
from fa4.sm90.bwd_config import default_config
from fa4.sm90.bwd_launch import flash_attn_bwd
from fa4.tensors import problem_of


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--config", default="{}", help="knob overrides of our default config (JSON)")
    ap.add_argument("--no-ref", action="store_true")
    a = ap.parse_args()
    S, D = a.seqlen, a.hdim
    B, H = max(1, 16384 // S), 2048 // D
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v, dout = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    out, lse = fa4.flash_attn_func(q, k, v, causal=a.causal, return_lse=True)
    prob = problem_of(q, k, v, a.causal, pass_="bwd", deterministic=False)
    cfg = dataclasses.replace(default_config(prob), **json.loads(a.config))
    runs = {"ours": lambda: flash_attn_bwd(dout, q, k, v, out, lse, None, a.causal, False, cfg)}
    if not a.no_ref:
        from flash_attn.cute import flash_attn_func as ref_fa4

        qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
        o = ref_fa4(qr, kr, vr, causal=a.causal)
        o = o[0] if isinstance(o, tuple) else o
        runs["ref"] = lambda: torch.autograd.grad(o, (qr, kr, vr), dout, retain_graph=True)
    for run in runs.values():
        for _ in range(3):
            run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for run in runs.values():
        run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("profiled:", list(runs), "config:", json.dumps(dataclasses.asdict(cfg)))


if __name__ == "__main__":
    main()
