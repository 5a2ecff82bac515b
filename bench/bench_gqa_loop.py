"""Backward TFLOP/s of gqa_reduce 'atomic' vs 'loop' vs the reference FA4 at issue 20's GQA shapes
(H200, bf16, one process, triton do_bench median), deterministic too.

Each side times its backward through autograd's inputs as bench/check_bwd.py does: ours as
fa4.sm90.bwd_launch.flash_attn_bwd on our forward's out/lse, the reference as
torch.autograd.grad through flash_attn.cute.flash_attn_func (what issue 20's table measured).
Variants: 'atomic' (today's default under GQA: dK/dV by fp32 reductions, dkv_store 'direct'),
'loop' with dkv_store 'tma' (the new default where its grid fills the machine) and 'direct'
(to separate the TMA store's share), each with the default launch order, and 'loop' / 'atomic'
with the shortest ('spt') or longest ('lpt') key tiles first; each non-deterministic and
deterministic. Before timing,
'loop' and 'atomic' gradients are compared (max relative difference, bf16 rounding expected).

    python bench/bench_gqa_loop.py [--out rows.json] [--shapes llama,qwen,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

SHAPES = {
    # name: (B, Sq, Sk, Hq, Hkv, d), causal
    "llama3-8b-8k": ((1, 8192, 8192, 32, 8, 128), True),
    "qwen2.5-7b-4k": ((2, 4096, 4096, 28, 4, 128), True),
    "sq2k-sk8k": ((1, 2048, 8192, 64, 8, 128), True),
    "sq128-sk8k": ((8, 128, 8192, 32, 8, 128), True),
    # hd64 under GQA: deterministic 'atomic' ran tile_m 64 there until session 13 (its dK/dV locks
    # spilled at 128 with the per-element dS^T store; with stmatrix it runs 128, the default since).
    "llama3.2-1b-8k": ((1, 8192, 8192, 32, 8, 64), True),
    # hd64 GQA beside it (session 12: 'loop' won at Llama-3.2-1B 8k in one run, lost in the next).
    "llama3.2-1b-4k-b2": ((2, 4096, 4096, 32, 8, 64), True),
    "sq2k-sk8k-hd64": ((1, 2048, 8192, 32, 8, 64), True),
}
VARIANTS = {
    "atomic": dict(gqa_reduce="atomic", dkv_store="direct"),
    "loop": dict(gqa_reduce="loop", dkv_store="tma"),
    "loop direct": dict(gqa_reduce="loop", dkv_store="direct"),
    # The launch order (a runtime knob: no other kernel): shortest key tiles first, or longest.
    "loop spt": dict(gqa_reduce="loop", dkv_store="tma", spt_order=True),
    "loop lpt": dict(gqa_reduce="loop", dkv_store="tma", spt_order=False),
    "atomic lpt": dict(gqa_reduce="atomic", dkv_store="direct", spt_order=False),
    # hd64: the 128-row query tile.
    "loop t128": dict(gqa_reduce="loop", dkv_store="tma", tile_m=128, dq_split="rows"),
    # hd64: 'atomic' at the 128-row tile with the stmatrix dS^T store (deterministic too since
    # session 13: there it is the masked default, and "atomic det" is this same kernel).
    "atomic t128": dict(gqa_reduce="atomic", dkv_store="direct", tile_m=128, dq_split="rows", ds_store="stmatrix"),
}


def max_rel_diff(xs, ys) -> float:
    """Largest max|x - y| / max|y| over pairs of gradients."""
    return max(((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)).item()
               for a, b in zip(xs, ys))


def bench_shape(name, shape, causal, device="cuda"):
    import triton.testing as tt

    import fa4
    from fa4.problem import Problem
    from fa4.sm90.bwd_config import violations
    from fa4.sm90.bwd_defaults import default_config
    from fa4.sm90.bwd_launch import flash_attn_bwd
    from fa4.tensors import problem_of

    def timed(run):
        run()
        return tt.do_bench(run, warmup=10, rep=100, return_mode="median")

    B, Sq, Sk, Hq, Hkv, d = shape
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, Sq, Hq, d, device=device, dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Sk, Hkv, d, device=device, dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Sk, Hkv, d, device=device, dtype=torch.bfloat16, generator=g)
    dout = torch.randn(B, Sq, Hq, d, device=device, dtype=torch.bfloat16, generator=g)
    out, lse = fa4.flash_attn_func(q, k, v, provider="fa4", causal=causal, return_lse=True)
    flops = Problem(B, Sq, Sk, Hq, Hkv, d, d, causal=causal, pass_="bwd").flops
    row = dict(name=name, B=B, Sq=Sq, Sk=Sk, Hq=Hq, Hkv=Hkv, d=d, causal=causal)
    grads = {}
    for det in (False, True):
        prob = problem_of(q, k, v, causal, pass_="bwd", deterministic=det)
        row["default" + (" det" if det else "")] = default_config(prob).gqa_reduce
        for vname, change in VARIANTS.items():
            label = vname + (" det" if det else "")
            cfg = dataclasses.replace(default_config(prob), **change)
            if violations(cfg, prob):
                row[label] = None
                continue
            try:
                def run(cfg=cfg, det=det):
                    return flash_attn_bwd(dout, q, k, v, out, lse, None, causal, det, cfg)
                grads[label] = run()
                row[label] = flops / timed(run) / 1e9
            except Exception as e:  # noqa: BLE001 - one failing variant must not hide the others
                row[label] = None
                print(f"{name} {label} failed: {type(e).__name__}: {e}"[:300], flush=True)
    if "atomic" in grads and "loop" in grads:
        row["max_rel_diff_loop_vs_atomic"] = max_rel_diff(grads["loop"], grads["atomic"])
    if "atomic t128 det" in grads and "atomic det" in grads:
        row["max_rel_diff_atomic_t128_det"] = max_rel_diff(grads["atomic t128 det"], grads["atomic det"])
    if "loop det" in grads:
        again = flash_attn_bwd(dout, q, k, v, out, lse, None, causal, True,
                               dataclasses.replace(default_config(problem_of(q, k, v, causal, pass_="bwd",
                                                                             deterministic=True)),
                                                   **VARIANTS["loop"]))
        row["loop_det_bitwise"] = all(torch.equal(a, b) for a, b in zip(grads["loop det"], again))
    del grads
    try:
        from flash_attn.cute import flash_attn_func as ref_fa4

        for det in (False, True):
            qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
            o = ref_fa4(qr, kr, vr, causal=causal, deterministic=det)
            o = o[0] if isinstance(o, tuple) else o
            row["ref" + (" det" if det else "")] = flops / timed(
                lambda o=o, qr=qr, kr=kr, vr=vr: torch.autograd.grad(o, (qr, kr, vr), dout, retain_graph=True)
            ) / 1e9
            del o, qr, kr, vr
    except Exception as e:  # noqa: BLE001
        print("reference FA4 failed:", str(e)[:300], flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    a = ap.parse_args()
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    rows = []
    for name in a.shapes.split(","):
        shape, causal = SHAPES[name]
        row = bench_shape(name, shape, causal)
        rows.append(row)
        print("BENCH " + json.dumps(row), flush=True)
        torch.cuda.empty_cache()

    def f(x):
        return f"{x:.0f}" if x else "-"

    def r(a, b):
        return f"{a / b:.3f}" if a and b else "-"

    print("\n| shape | default | atomic | loop | loop direct | loop spt | loop lpt | atomic lpt | ref | loop/atomic | "
          "loop/ref | atomic/ref | atomic det | loop det | loop spt det | loop lpt det | ref det | "
          "loop det/non-det | loop det/ref det |")
    print("|" + "---|" * 19)
    for x in rows:
        print(f"| {x['name']} | {x.get('default')} | {f(x.get('atomic'))} | {f(x.get('loop'))} | "
              f"{f(x.get('loop direct'))} | {f(x.get('loop spt'))} | {f(x.get('loop lpt'))} | "
              f"{f(x.get('atomic lpt'))} | {f(x.get('ref'))} | {r(x.get('loop'), x.get('atomic'))} | "
              f"{r(x.get('loop'), x.get('ref'))} | {r(x.get('atomic'), x.get('ref'))} | {f(x.get('atomic det'))} | "
              f"{f(x.get('loop det'))} | {f(x.get('loop spt det'))} | {f(x.get('loop lpt det'))} | "
              f"{f(x.get('ref det'))} | {r(x.get('loop det'), x.get('loop'))} | "
              f"{r(x.get('loop det'), x.get('ref det'))} |")
    print("\n| shape (hd64) | atomic det | atomic t128 det | loop t128 det | atomic | atomic t128 | "
          "atomic t128 det / atomic det | t128 rel diff |")
    print("|" + "---|" * 8)
    for x in rows:
        if x["d"] != 64:
            continue
        print(f"| {x['name']} | {f(x.get('atomic det'))} | {f(x.get('atomic t128 det'))} | "
              f"{f(x.get('loop t128 det'))} | {f(x.get('atomic'))} | {f(x.get('atomic t128'))} | "
              f"{r(x.get('atomic t128 det'), x.get('atomic det'))} | {x.get('max_rel_diff_atomic_t128_det')} |")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
