"""Effect of each forward knob measured alone, against the default config, on the H200.

For each shape: the default config and one variant per knob change, timed with
triton.testing.do_bench (median) in the same process; prints TFLOP/s and the ratio
to the default. Shapes follow the benchmark convention (16k tokens, heads*hd = 2048).

    python bench/knob_effects.py --shapes 8192:64:0,8192:128:0 [--out effects.json]

A shape is SEQLEN:HDIM:CAUSAL, or SEQLEN:HDIM:CAUSAL:BATCH:HEADS[:KV_HEADS] for a model's exact
shape (GPT-2: 1024:64:1:16:12; Llama-3-8B's 8k prefill under GQA: 8192:128:1:1:32:8). ``--peers cudnn,flash-attn-4`` times those providers' plain calls in the
same loop (a row each, its ratio to our default), and ``--rounds N`` repeats the whole list N times
in a rotated order, so no variant is always timed first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import torch

import fa4
from fa4.problem import Problem
from fa4.sm90.fwd_config import default_config, violations

VARIANTS = [
    {},
    {"pingpong": "off"},
    {"pingpong": "mma_exp"},
    {"intra_wg_overlap": False},
    {"exp2_emu_frac": 0.125},
    {"exp2_emu_frac": 0.25},
    {"exp2_emu_frac": 0.375},
    {"exp2_emu_frac": 0.25, "exp2_emu_pattern": "spread"},
    {"tau": 8.0},
    {"kv_stages": 3},
    {"p_operand": "smem"},
    {"p_operand": "smem", "tile_n": 144},
    {"p_operand": "smem", "tile_n": 192},
    {"tile_n": 64},
    {"tile_n": 96},
    {"tile_n": 112},
    {"tile_n": 144},
    {"tile_n": 160},
    {"tile_n": 176},
    {"sched_order": "natural"},
    {"head_swizzle": 4},
]


def main():
    import triton.testing as tt

    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192:64:0,8192:128:0")
    ap.add_argument("--out", default=None)
    ap.add_argument("--variants", default=None, help="JSON list of knob changes (default: the built-in list)")
    ap.add_argument("--check", action="store_true", help="correctness gate per variant (an odd GQA shape, the shape's own mask) before timing")
    ap.add_argument("--peers", default="", help="comma-separated providers timed beside the variants (cudnn, flash-attn-4, fa2)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the variant list, rotated, this many times")
    a = ap.parse_args()
    variants = json.loads(a.variants) if a.variants else VARIANTS
    checker = None
    if a.check:
        import importlib.util
        from pathlib import Path

        mod_spec = importlib.util.spec_from_file_location("check_fwd", Path(__file__).with_name("check_fwd.py"))
        checker = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(checker)
    peers = [p for p in a.peers.split(",") if p]
    rows = []
    for spec in a.shapes.split(","):
        S, D, c, *bh = (int(x) for x in spec.split(":"))
        shape = dict(batch=bh[0], heads_q=bh[1]) if bh else {}
        if len(bh) > 2:
            shape["heads_kv"] = bh[2]
        prob = Problem.standard(S, D, causal=bool(c), **shape)
        base = default_config(prob)
        q, k, v = (torch.randn(prob.batch, S, h, D, device="cuda", dtype=torch.bfloat16)
                   for h in (prob.heads_q, prob.heads_kv, prob.heads_kv))
        entries = []  # (label, callable): the default first, then the variants that pass, then the peers
        for var in variants:
            cfg = dataclasses.replace(base, **var)
            if var and cfg == base:
                continue
            bad = violations(cfg, prob)
            if bad:
                print("SKIP infeasible", spec, var, bad, flush=True)
                continue
            if checker is not None:
                # the shape's own mask (a causal default may carry causal-only knobs: mask_bits)
                ok = checker.check_case(1, 777, 1000, 8, 2, D, bool(c), torch.bfloat16, cfg)[0]
                if not ok:
                    print("INCORRECT", spec, var, ok, flush=True)
                    continue
            entries.append((json.dumps(var) if var else "default",
                            lambda cfg=cfg: fa4.flash_attn_func(q, k, v, provider="fa4", causal=bool(c), config=cfg)))
        for p in peers:
            entries.append((p, lambda p=p: fa4.flash_attn_func(q, k, v, provider=p, causal=bool(c))))
        live = []
        for label, fn in entries:
            try:
                fn()
                live.append((label, fn))
            except Exception as e:  # noqa: BLE001
                print("FAILED", spec, label, str(e)[:200], flush=True)
        times: dict[str, list[float]] = {label: [] for label, _ in live}
        for r in range(a.rounds):
            order = live[r % len(live):] + live[:r % len(live)] if live else []
            for label, fn in order:
                times[label].append(tt.do_bench(fn, warmup=50, rep=250, return_mode="median"))
        base_ms = statistics.median(times["default"]) if "default" in times else None
        for label, ts in times.items():
            ms = statistics.median(ts)
            row = dict(S=S, D=D, causal=bool(c), batch=prob.batch, heads=prob.heads_q, heads_kv=prob.heads_kv,
                       change=label,
                       ms=round(ms, 4), tflops=round(prob.flops / ms / 1e9, 1),
                       vs_default=round(base_ms / ms, 3) if base_ms else None,
                       rounds=[round(t, 4) for t in ts])
            rows.append(row)
            print("EFFECT " + json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
