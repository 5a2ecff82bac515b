"""One backward of ours and one of the reference FA4, inside a profiler range, for Nsight Compute.

Both run a few times first (JIT compile, warm caches); then cudaProfilerStart, one backward each,
cudaProfilerStop. Under ncu with --profile-from-start off only those launches are profiled:

    ncu --profile-from-start off --clock-control none --set full -o $OUT/bwd \\
        python3 bench/profile_bwd.py --seqlen 8192 --hdim 128 --causal [--config JSON] [--window L,R]

The same inputs for both (16k tokens, heads*hd = 2048, bf16), as check_bwd.py's timing table;
``--window 1023,0`` is issue 18's sliding window (bottom-right aligned; -1 an unbounded side).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

import fa4
from fa4.sm90.bwd_defaults import default_config
from fa4.sm90 import bwd_launch
from fa4.tensors import problem_of


def parse(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--config", default="{}", help="knob overrides of our default config (JSON)")
    ap.add_argument("--no-ref", action="store_true")
    ap.add_argument("--window", default="-1,-1", help="sliding window L,R (-1: unbounded side)")
    ap.add_argument("--width", type=int, default=2048, help="heads x head_dim (GPT-2: 768, i.e. H12 at hd64)")
    return ap.parse_args(argv)


def backwards(a, device="cuda", tokens=16384, width=None):
    """({'ours': run, 'ref': run}, our config): each run one backward on the same inputs
    (``tokens`` = B*S, ``width`` = H*D; the reference unless --no-ref)."""
    S, D = a.seqlen, a.hdim
    width = width or getattr(a, "width", 2048)
    B, H = max(1, tokens // S), width // D
    left, right = (int(x) for x in a.window.split(","))
    win = dict(window_left=left, window_right=right)
    window_size = (None if left < 0 else left, None if right < 0 else right)
    g = torch.Generator(device=device).manual_seed(7)
    q, k, v, dout = (torch.randn(B, S, H, D, device=device, dtype=torch.bfloat16, generator=g) for _ in range(4))
    out, lse = fa4.flash_attn_func(q, k, v, provider="fa4", causal=a.causal, return_lse=True, window_size=window_size)
    prob = problem_of(q, k, v, a.causal, pass_="bwd", deterministic=False, **win)
    cfg = dataclasses.replace(default_config(prob), **json.loads(a.config))
    # Only a bounded side is passed: the plain call stays the one without features.
    feat = {n: x for n, x in win.items() if x >= 0}
    runs = {"ours": lambda: bwd_launch.flash_attn_bwd(dout, q, k, v, out, lse, None, a.causal, False, cfg, **feat)}
    if not a.no_ref:
        from flash_attn.cute import flash_attn_func as ref_fa4

        qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
        o = ref_fa4(qr, kr, vr, causal=a.causal, window_size=window_size)
        o = o[0] if isinstance(o, tuple) else o
        runs["ref"] = lambda: torch.autograd.grad(o, (qr, kr, vr), dout, retain_graph=True)
    return runs, cfg


def main():
    a = parse()
    runs, cfg = backwards(a)
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
