"""Our deterministic backward against our non-deterministic one, same process, same inputs (issue
20's bar: deterministic >= 0.95x non-deterministic at each real-model shape). Each side's config is
the one a call resolves for its mode (bench/bwd_order.py's setup); the two are timed in interleaved
rounds (do_bench median, the better round); the largest relative difference between their
gradients is reported beside the times (a report, not a gate).

    python3 bench/det_ratio.py [--shapes llama3-8b-8k,qwen2.5-7b-4k,...] [--rounds 3] [--out rows.json]
        [--det-variants '[{"spt_order": false, "head_swizzle": 4}]']

``--det-variants``: knob overrides of the deterministic config, each timed in the same rounds and
reported against the same non-deterministic time (only where feasible for the shape).
``--zero-all``: also the deterministic default with every row of the dQ sums zeroed by the
preprocess, as before its first dQ turns stored (session 35): that change's A/B in one process.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bwd_order  # noqa: E402

SHAPES = "llama3-8b-8k,qwen2.5-7b-4k,sq2k-sk8k,llama3.2-1b-8k,gpt2-1k,causal-8k,varlen-causal"


def zeroing_all_rows(fn):
    """``fn`` with the preprocess zeroing every dQ accumulator row: plans of their own (a plan holds
    the row count, or for varlen the preprocess variant), built while dq_zero_rows answers 'all of
    them' and varlen_zero_tile 'no per-sequence zeroing'."""
    from fa4.sm90 import bwd_launch

    plans, varlen_plans = {}, {}

    def run(cfg):
        saved = bwd_launch._plans, bwd_launch._varlen_plans, bwd_launch.dq_zero_rows, bwd_launch.varlen_zero_tile
        bwd_launch._plans, bwd_launch._varlen_plans = plans, varlen_plans
        bwd_launch.dq_zero_rows = lambda *a: bwd_launch.ZERO_ALL_ROWS
        bwd_launch.varlen_zero_tile = lambda *a: 0
        try:
            return fn(cfg)
        finally:
            bwd_launch._plans, bwd_launch._varlen_plans, bwd_launch.dq_zero_rows, bwd_launch.varlen_zero_tile = saved

    return run


def ratio_row(name: str, rounds: int, det_variants=(), zero_all: bool = False) -> dict:
    import triton.testing as tt

    from bench.bench_gqa_loop import max_rel_diff
    from fa4.arch import SM90
    from fa4.sm90.bwd_config import violations

    nondet, _, cfg_n, flops = bwd_order.setup(name, False)
    det, _, cfg_d, _ = bwd_order.setup(name, True)
    diff = max_rel_diff(det(cfg_d), nondet(cfg_n))
    order = [("nondet", nondet, cfg_n), ("det", det, cfg_d)]
    skipped = {}
    for o in det_variants:
        cfg = bwd_order.variant_config(cfg_d, o)
        bad = violations(cfg, det.problem, SM90)
        if bad:
            skipped[bwd_order.label(o)] = str(bad[0])
            continue
        # Deterministic variants must give the default deterministic kernel's gradients up to the
        # order of the fp32 adds (a different turn order is another fixed order).
        vdiff = max_rel_diff(det(cfg), det(cfg_d))
        if vdiff > 2 ** -6:
            skipped[bwd_order.label(o)] = f"gradients differ from the default's by {vdiff:.3g}"
            continue
        order.append(("det " + bwd_order.label(o), det, cfg))
    if zero_all:
        zdet = zeroing_all_rows(det)
        vdiff = max_rel_diff(zdet(cfg_d), det(cfg_d))
        if vdiff != 0:
            skipped["zero-all"] = f"gradients differ from the default's by {vdiff:.3g}"
        else:
            order.append(("det zero-all", zdet, cfg_d))
    times = {lab: [] for lab, _, _ in order}
    for r in range(rounds):
        for lab, fn, cfg in (order if r % 2 == 0 else order[::-1]):
            times[lab].append(tt.do_bench(lambda fn=fn, cfg=cfg: fn(cfg), warmup=10, rep=80, return_mode="median"))
    best = {k: min(v) for k, v in times.items()}
    return dict(name=name, det_config=str(cfg_d), nondet_config=str(cfg_n), max_rel_diff=diff, ms=times,
                tflops={k: flops / t / 1e9 for k, t in best.items()}, ratio=best["nondet"] / best["det"],
                variants={k: best["nondet"] / t for k, t in best.items() if k.startswith("det ")}, skipped=skipped)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--det-variants", default="[]", help="JSON list of knob overrides of the deterministic config")
    ap.add_argument("--zero-all", action="store_true", help="also the deterministic default zeroing every dQ row")
    a = ap.parse_args(argv)
    variants = [dict(v) for v in json.loads(a.det_variants)]
    rows = []
    for name in a.shapes.split(","):
        try:
            row = ratio_row(name, a.rounds, variants, a.zero_all)
        except Exception as e:  # noqa: BLE001 - one failing shape must not hide the others
            row = dict(name=name, error=f"{type(e).__name__}: {e}"[:400])
        rows.append(row)
        print("BENCH " + json.dumps(row), flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps(rows, indent=1))
    print("\n| shape | non-det TFLOP/s | det TFLOP/s | det/non-det | grads max rel diff |\n|---|---:|---:|---:|---:|")
    for x in rows:
        if "error" in x:
            print(f"| {x['name']} | error: {x['error'][:120]} | | | |")
            continue
        t = x["tflops"]
        print(f"| {x['name']} | {t['nondet']:.1f} | {t['det']:.1f} | {x['ratio']:.3f} | {x['max_rel_diff']:.2g} |")
    for x in rows:
        for lab, r in x.get("variants", {}).items():
            print(f"  {x['name']}: {lab}: det/non-det {r:.3f} ({x['tflops'][lab]:.1f} TFLOP/s)")
        for lab, why in x.get("skipped", {}).items():
            print(f"  {x['name']}: {lab} skipped: {why}")


if __name__ == "__main__":
    main()
