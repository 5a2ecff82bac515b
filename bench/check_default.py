"""flash_attn_func's default provider ("auto") on the GPU: what a plain call runs, its error and its host cost.

    python3 bench/check_default.py [--db sqlite:///measured.db] [--calls 2000]

With FA4_DB pointing at --db (default: a fresh empty DB, where every call must be ours), for
GPT-2 1k (B16 H12 hd64) and a GQA hd128 causal 2k shape: the provider a plain call dispatched to
(fa4.interface's cache of choices), and its output and gradients against an fp32 reference, as a
multiple of PyTorch's own bf16 error on the same inputs (check_bwd.attention in each dtype). Then the host cost per call of a plain
call against provider="fa4" on the tiny problem (B1 S128 H4 hd128 causal; host_cost.py's loop, A and B
interleaved 5 times, medians): the dispatch's price per call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from host_cost import per_call_us  # run from bench/


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    os.environ["FA4_DB"] = a.db or f"sqlite:///{tempfile.mkdtemp()}/empty.db"
    os.environ["FA4_LOOKUP_LOCAL_DB"] = "1"  # the device scripts turn the local lookup off
    import torch
    from check_bwd import attention  # the bench's autograd reference (after FA4_DB is set: it imports fa4)

    import fa4
    from fa4 import interface

    bad = 0
    for b, s, hq, hkv, d in ((16, 1024, 12, 12, 64), (2, 2048, 16, 4, 128)):
        torch.manual_seed(0)
        q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
        interface._chosen.clear()
        out = fa4.flash_attn_func(q, k, v, causal=True)
        grads = torch.autograd.grad(out, (q, k, v), do)
        with torch.no_grad():
            fwd_only = fa4.flash_attn_func(q, k, v, causal=True)
        # An entry is the provider, or a mode -> provider map where the modes choose differently.
        chosen = sorted({c for e in interface._chosen.values() for c in ([e] if isinstance(e, str) else e.values())})
        errs = []
        for dt in (torch.float32, torch.bfloat16):
            qr, kr, vr = (t.detach().to(dt).requires_grad_(True) for t in (q, k, v))
            o = attention(qr, kr, vr, True, d ** -0.5)
            errs.append((o, torch.autograd.grad(o, (qr, kr, vr), do.to(dt))))
        (ref_o, ref_g), (bf_o, bf_g) = errs
        rows = [("out", out, ref_o, bf_o), ("out (no grad)", fwd_only, ref_o, bf_o)]
        rows += [(n, x, r, p) for n, x, r, p in zip(("dq", "dk", "dv"), grads, ref_g, bf_g)]
        line = []
        for n, x, r, p in rows:
            ours = (x.float() - r.float()).abs().max().item()
            torch_err = (p.float() - r.float()).abs().max().item()
            ok = ours <= 3 * torch_err + 1e-5
            bad += not ok
            line.append(f"{n} {ours:.2e} ({ours / torch_err:.2f}x torch bf16){'' if ok else ' TOO LARGE'}")
        print(f"B{b} S{s} H{hq}/{hkv} d{d} causal: default call ran {chosen}; " + "; ".join(line), flush=True)

    q, k, v, dg = (torch.randn(1, 128, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    loops = {}
    for name, kw in (("default", {}), ("provider='fa4'", {"provider": "fa4"})):
        def fwd(kw=kw):
            with torch.no_grad():
                fa4.flash_attn_func(q, k, v, causal=True, **kw)

        def fwd_bwd(kw=kw):
            torch.autograd.grad(fa4.flash_attn_func(qg, kg, vg, causal=True, **kw), (qg, kg, vg), dg)

        loops[name] = (fwd, fwd_bwd)
        for fn in (fwd, fwd_bwd):
            for _ in range(20):
                fn()
    res = {n: ([], []) for n in loops}
    for _ in range(5):
        for n, (fwd, fwd_bwd) in loops.items():
            res[n][0].append(per_call_us(fwd, a.calls))
            res[n][1].append(per_call_us(fwd_bwd, a.calls))
    for n, (f, fb) in res.items():
        print(f"host us per call, {n}: fwd {statistics.median(f):.1f} (runs {', '.join(f'{x:.1f}' for x in f)}), "
              f"fwd+bwd {statistics.median(fb):.1f} (runs {', '.join(f'{x:.1f}' for x in fb)})")
    print(f"errors above 3x PyTorch's bf16 error: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
