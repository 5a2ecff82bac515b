"""The backward's launch order (the runtime knobs spt_order and head_swizzle: one compiled kernel
per shape, no recompiles) against the reference FA4, at the shapes where issues 18 and 20 miss
their bars: packed varlen (8 documents of 512-4096 tokens), the sliding window, the sink, the GQA
shapes of real models, and plain causal as the control.

Why it may matter: a CTA's work under causal masking is the number of query tiles its key tile
sees, so it varies up to 32x inside one launch; packed varlen adds one grid row per document whose
key tiles past the document's end exit at once. A list-scheduling model of the varlen launch on
132 SMs (bench/RESULTS.md, session 11) gives 0.957 of the ideal for today's default order
(shortest key tiles first, one head per group) and 0.993 for the longest-first order with 16
heads per group. Prediction: varlen causal backward +3%; dense shapes within noise.

Both sides run their backward launch alone on the reference forward's out and lse (as
bench/check_bwd_feat.py and bench/bench_varlen.py do), do_bench median; every variant is timed
twice in interleaved rounds and the reference at the start and end of each round.

    python bench/bwd_order.py [--out rows.json] [--shapes varlen-causal,llama3-8b-8k,...]
        [--orders default,1:1,0:4] [--rounds 2] [--det]

``--orders`` lists spt_order:head_swizzle pairs ("default": the config a call resolves, as it is);
``--det`` times the deterministic kernels of both sides. Session 11's three runs of this script
set today's default (fa4.sm90.bwd_defaults.default_launch_order).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

LENS = [2048, 512, 4096, 1024, 3072, 1536, 2560, 1536]
# name: (B, Sq, Sk, Hq, Hkv, d[, dv]), causal, ours' features, the reference's keywords
SHAPES = {
    "varlen-causal": ((None, None, None, 16, 16, 128), True, {}, {}),
    "varlen": ((None, None, None, 16, 16, 128), False, {}, {}),
    "window": ((1, 16384, 16384, 16, 16, 128), False, dict(window_left=1023, window_right=0),
               dict(window_size=(1023, 0))),
    "sink": ((2, 8192, 8192, 16, 16, 128), True, dict(sink=True), dict(learnable_sink=True)),
    "softcap": ((2, 8192, 8192, 16, 16, 128), True, dict(softcap=30.0), dict(softcap=30.0)),
    "llama3-8b-8k": ((1, 8192, 8192, 32, 8, 128), True, {}, {}),
    "qwen2.5-7b-4k": ((2, 4096, 4096, 28, 4, 128), True, {}, {}),
    "causal-8k": ((2, 8192, 8192, 16, 16, 128), True, {}, {}),
    "llama3.2-1b-8k": ((1, 8192, 8192, 32, 8, 64), True, {}, {}),
    "gpt2-1k": ((16, 1024, 1024, 12, 12, 64), True, {}, {}),
    "hd64-8k": ((2, 8192, 8192, 32, 32, 64), True, {}, {}),
    "hd96-8k": ((2, 8192, 8192, 21, 21, 96), True, {}, {}),
    "hd96-8k-noncausal": ((2, 8192, 8192, 21, 21, 96), False, {}, {}),
    "hd64-8k-noncausal": ((2, 8192, 8192, 32, 32, 64), False, {}, {}),
    "hd192-8k": ((2, 8192, 8192, 10, 10, 192), True, {}, {}),
    "hd192v128-8k": ((2, 8192, 8192, 10, 10, 192, 128), True, {}, {}),
    "hd256-8k": ((2, 8192, 8192, 8, 8, 256), True, {}, {}),
    "hd192-8k-noncausal": ((2, 8192, 8192, 10, 10, 192), False, {}, {}),
    "hd192v128-8k-noncausal": ((2, 8192, 8192, 10, 10, 192, 128), False, {}, {}),
    "hd256-8k-noncausal": ((2, 8192, 8192, 8, 8, 256), False, {}, {}),
    "sq2k-sk8k": ((1, 2048, 8192, 64, 8, 128), True, {}, {}),
    "sq128-sk8k": ((8, 128, 8192, 32, 8, 128), True, {}, {}),
    "noncausal-8k": ((2, 8192, 8192, 16, 16, 128), False, {}, {}),
    # Short causal sequences (session 32's launch-order study: 8-32 key tiles a head).
    "hd64-2k": ((8, 2048, 2048, 16, 16, 64), True, {}, {}),
    "hd64-4k": ((4, 4096, 4096, 16, 16, 64), True, {}, {}),
    "hd96-1k": ((16, 1024, 1024, 16, 16, 96), True, {}, {}),
    "hd128-1k": ((16, 1024, 1024, 16, 16, 128), True, {}, {}),
    "hd128-2k": ((8, 2048, 2048, 16, 16, 128), True, {}, {}),
    "hd128-2k-gqa": ((8, 2048, 2048, 32, 8, 128), True, {}, {}),
}
ORDERS = [(spt, swz) for spt in (True, False) for swz in (1, 2, 4, 8, 16)]
DEFAULT = ("default", 0)  # the shape's default config as it is


def pairs(shape, causal, feat):
    """Visible (query, key) pairs summed over batch (or the packed documents) and heads: the FLOPs'
    region (fa4.problem.visible_pairs, bottom-right aligned)."""
    from fa4.problem import visible_pairs

    B, Sq, Sk, Hq = shape[:4]
    right = 0 if causal else feat.get("window_right", -1)
    left, right = (None if x < 0 else x for x in (feat.get("window_left", -1), right))
    if B is None:
        return sum(visible_pairs(n, n, 0, left, right) for n in LENS) * Hq
    return visible_pairs(Sq, Sk, Sk - Sq, left, right) * B * Hq


def setup(name, det):
    """(ours(config) -> grads, ref() -> grads, default config, FLOPs) of one shape; ``det``: the
    deterministic backwards of both sides."""
    from flash_attn.cute import flash_attn_func as ref_fa
    from flash_attn.cute import flash_attn_varlen_func as ref_varlen
    from flash_attn.cute.interface import _flash_attn_bwd

    from fa4.features import normalize
    from fa4.lookup import resolve_config
    from fa4.launch import bwd_config_for
    from fa4.sm90.bwd_launch import launch_bwd, launch_bwd_varlen
    from fa4.launch import with_features
    from fa4.tensors import arch_of, problem_of
    from fa4.varlen import bwd_problem
    from fa4.varlen import cu_seqlens

    shape, causal, feat, ref_kw = SHAPES[name]
    B, Sq, Sk, Hq, Hkv, d = shape[:6]
    dv = shape[6] if len(shape) > 6 else d
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16
    scale = 1 / math.sqrt(d)
    flops = 2.5 * 2 * (d + dv) * pairs(shape, causal, feat)
    if B is None:
        tot, m = sum(LENS), max(LENS)
        q, k, v, dout = (torch.randn(tot, h, d, device="cuda", dtype=bf, generator=g) for h in (Hq, Hkv, Hkv, Hq))
        cu = cu_seqlens(LENS)
        with torch.no_grad():
            res = ref_varlen(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=m, max_seqlen_k=m,
                             causal=causal, return_lse=True)
        out, lse = res[0], res[1].float().contiguous()
        problem = bwd_problem(q, k, v, len(LENS), m, m, normalize(q[None], causal, (None, None), None, 0.0), det)
        config = resolve_config(problem, arch_of(q.device), None)[1]

        def ours(cfg):
            return launch_bwd_varlen(dout, q, k, v, out, lse, cu, cu, m, m, None, None, scale, causal, det, cfg)
        ours.problem = problem

        def ref():
            return _flash_attn_bwd(q, k, v, out, dout, lse, scale, causal, 0.0, window_size_left=None,
                                   window_size_right=None, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=m,
                                   max_seqlen_k=m, deterministic=det)
        return ours, ref, config, flops
    q = torch.randn(B, Sq, Hq, d, device="cuda", dtype=bf, generator=g)
    k = torch.randn(B, Sk, Hkv, d, device="cuda", dtype=bf, generator=g)
    v = torch.randn(B, Sk, Hkv, dv, device="cuda", dtype=bf, generator=g)
    dout = torch.randn(B, Sq, Hq, dv, device="cuda", dtype=bf, generator=g)
    sink = torch.randn(Hq, device="cuda", generator=g) if feat.get("sink") else None
    ref_kw = dict(ref_kw)
    if sink is not None:
        ref_kw["learnable_sink"] = sink
    with torch.no_grad():
        res = ref_fa(q, k, v, causal=causal, return_lse=True, **ref_kw)
    out, lse = res[0], res[1].float().contiguous()
    kw = {n: x for n, x in feat.items() if n != "sink"}
    # The config a flash_attn_func call's backward resolves (the features in its problem).
    config = bwd_config_for(q, k, v, causal, det, None, sink=sink is not None, **kw)

    def ours(cfg):
        return launch_bwd(dout, q, k, v, out, lse, scale, causal, det, cfg, sink=sink, **kw)
    ours.problem = with_features(problem_of(q, k, v, causal, pass_="bwd", deterministic=det), sink=sink is not None,
                                 **kw)

    left, right = ref_kw.get("window_size", (None, None))

    def ref():
        return _flash_attn_bwd(q, k, v, out, dout, lse, scale, causal, ref_kw.get("softcap", 0.0), window_size_left=left,
                               window_size_right=right, learnable_sink=ref_kw.get("learnable_sink"),
                               deterministic=det)
    return ours, ref, config, flops


def label(o):
    if isinstance(o, dict):  # a --variants entry: knob overrides of the default config
        return ",".join(f"{k}={v}" for k, v in sorted(o.items()))
    return "default" if o == DEFAULT else f"spt={int(o[0])} swz={o[1]}"


def variant_config(config, o):
    """The config ``o`` times: the default, a launch order, or the default with knob overrides."""
    if o == DEFAULT:
        return config
    if isinstance(o, dict):
        return dataclasses.replace(config, **o)
    return dataclasses.replace(config, spt_order=o[0], head_swizzle=o[1])


def served_overrides(db, problem, config):
    """The knobs in which the config the results DB ``db`` serves for ``problem`` on this GPU (the
    tuner's verdict) differs from ``config``: {} where the default is served, None without a verdict."""
    from fa4.knobs import config_to_dict
    from providers import get_provider
    from store import ResultsStore
    from tuner.device import cuda_device_info

    device = cuda_device_info(get_provider("fa4").versions())["name"]
    with ResultsStore.open(db) as store:
        verdict = store.verdict(device, "fa4", problem)
    if verdict is None:
        return None
    default = config_to_dict(config)
    return {k: v for k, v in verdict["measurement"]["config"].items() if default.get(k) != v}


def bench_shape(name, orders, rounds=2, det=False, served_db=None, variant_tol=1e-3):
    import triton.testing as tt

    def timed(fn):
        return tt.do_bench(fn, warmup=10, rep=80, return_mode="median")

    from bench.bench_gqa_loop import max_rel_diff
    from fa4.arch import SM90
    from fa4.sm90.bwd_config import violations

    ours, ref, config, flops = setup(name, det)
    served = served_overrides(served_db, ours.problem, config) if served_db else None
    if served:
        orders = [*orders, served]
    b = ref()
    a = ours(config)
    diff = max_rel_diff(a, b)
    # A knob variant runs only where it is feasible for the shape's config, and only once its
    # gradients agree with the default's as the default's agree with the reference's.
    skipped = {}
    for o in orders:
        if isinstance(o, dict):
            bad = violations(variant_config(config, o), ours.problem, SM90)
            if bad:
                skipped[label(o)] = "; ".join(bad)[:300]
                continue
            vdiff = max_rel_diff(ours(variant_config(config, o)), b)
            if not vdiff <= 2 * diff + variant_tol:
                skipped[label(o)] = f"gradients off the reference: {vdiff:.3g} against the default's {diff:.3g}"
    run = [o for o in orders if label(o) not in skipped]
    times = {label(o): [] for o in run}
    ref_t = []
    for r in range(rounds):
        ref_t.append(timed(ref))
        for o in (run if r % 2 == 0 else run[::-1]):
            cfg = variant_config(config, o)
            times[label(o)].append(timed(lambda cfg=cfg: ours(cfg)))
        ref_t.append(timed(ref))
    t_ref = sorted(ref_t)[len(ref_t) // 2]
    row = dict(name=name, deterministic=det, default=dict(spt_order=config.spt_order, head_swizzle=config.head_swizzle),
               config=str(config), max_rel_diff_vs_ref=diff, ref_ms=ref_t, ref_tflops=flops / t_ref / 1e9,
               orders={lab: dict(ms=t, tflops=flops / min(t) / 1e9, ratio=t_ref / min(t))
                       for lab, t in times.items()}, skipped=skipped)
    if served_db:
        row["served"] = "no verdict" if served is None else (label(served) if served else "the default")
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--det", action="store_true", help="deterministic backwards (ours and the reference's)")
    ap.add_argument("--orders", default=None, help="e.g. 1:1,0:2,0:4 (spt_order:head_swizzle)")
    ap.add_argument("--variants", default="[]",
                    help='JSON list of knob overrides of the default config, each timed beside the orders, '
                         'e.g. \'[{"ds_early": true}]\'')
    ap.add_argument("--variant-tol", type=float, default=1e-3,
                    help="a variant's allowance beyond twice the default's max relative difference from the "
                         "reference's gradients (bf16 outputs: one rounding flip near the largest gradient "
                         "moves it by up to 2^-8); widen it only beside an fp32 check of the variant")
    ap.add_argument("--served", default=None, metavar="DB",
                    help="also time the config this results DB serves for each shape (fa4-tune's verdict)")
    a = ap.parse_args()
    orders = ORDERS
    if a.orders:
        orders = [DEFAULT if x == "default" else (bool(int(x.split(":")[0])), int(x.split(":")[1]))
                  for x in a.orders.split(",")]
    orders = orders + [dict(v) for v in json.loads(a.variants)]
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    rows = []
    for name in a.shapes.split(","):
        try:
            row = bench_shape(name, orders, a.rounds, a.det, a.served, a.variant_tol)
        except Exception as e:  # noqa: BLE001 - one failing shape must not hide the others
            row = dict(name=name, error=f"{type(e).__name__}: {e}"[:400])
        rows.append(row)
        print("BENCH " + json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "w") as fh:
                json.dump(rows, fh, indent=1)
        torch.cuda.empty_cache()
    print("\n| shape | default | ref TFLOP/s | " + " | ".join(label(o) for o in orders) + " |")
    print("|" + "---|" * (3 + len(orders)))
    for x in rows:
        if "error" in x:
            print(f"| {x['name']} | error: {x['error'][:120]} |")
            continue
        d = x["default"]
        cells = " | ".join(f"{x['orders'][label(o)]['ratio']:.3f}" if label(o) in x["orders"] else "skipped"
                           for o in orders)
        print(f"| {x['name']} | spt{int(d['spt_order'])} s{d['head_swizzle']} | {x['ref_tflops']:.0f} | {cells} |")
        if "served" in x:
            s = x["orders"].get(x["served"])
            why = x["skipped"].get(x["served"])
            print(f"  served ({x['served']}): " + (f"{s['ratio']:.3f} of the reference" if s
                                                   else f"not timed: {why}" if why else "timed as the default"))


if __name__ == "__main__":
    main()
