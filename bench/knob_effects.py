"""Effect of each forward knob measured alone, against the default config, on the H200.

For each shape: the default config and one variant per knob change, timed with
triton.testing.do_bench (median) in the same process; prints TFLOP/s and the ratio
to the default. Shapes follow the benchmark convention (16k tokens, heads*hd = 2048).

    python bench/knob_effects.py --shapes 8192:64:0,8192:128:0 [--out effects.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

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
    ap.add_argument("--check", action="store_true", help="correctness gate per variant (odd shapes, causal both) before timing")
    a = ap.parse_args()
    variants = json.loads(a.variants) if a.variants else VARIANTS
    checker = None
    if a.check:
        import importlib.util
        from pathlib import Path

        spec = importlib.util.spec_from_file_location("check_fwd", Path(__file__).with_name("check_fwd.py"))
        checker = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(checker)
    rows = []
    for spec in a.shapes.split(","):
        S, D, c = (int(x) for x in spec.split(":"))
        prob = Problem.standard(S, D, causal=bool(c))
        base = default_config(prob)
        q, k, v = (torch.randn(prob.batch, S, prob.heads_q, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        base_t = None
        for var in variants:
            cfg = dataclasses.replace(base, **var)
            if var and cfg == base:
                continue
            bad = violations(cfg, prob)
            if bad:
                print("SKIP infeasible", spec, var, bad, flush=True)
                continue
            if checker is not None:
                oks = [checker.check_case(1, 777, 1000, 8, 2, D, cc, torch.bfloat16, cfg)[0] for cc in (False, True)]
                if not all(oks):
                    print("INCORRECT", spec, var, oks, flush=True)
                    continue
            try:
                fa4.flash_attn_func(q, k, v, provider="fa4", causal=bool(c), config=cfg)
                ms = tt.do_bench(lambda: fa4.flash_attn_func(q, k, v, provider="fa4", causal=bool(c), config=cfg),
                                 warmup=50, rep=250, return_mode="median")
                tf = prob.flops / ms / 1e9
            except Exception as e:  # noqa: BLE001
                print("FAILED", spec, var, str(e)[:200], flush=True)
                continue
            if not var:
                base_t = tf
            row = dict(S=S, D=D, causal=bool(c), change=var or "default", tflops=round(tf, 1),
                       vs_default=round(tf / base_t, 3) if base_t else None)
            rows.append(row)
            print("EFFECT " + json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
