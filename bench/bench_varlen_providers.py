"""The tuner's varlen measurement, ours vs the reference FA4, in one process: each provider's
make_fwd / make_fwd_bwd (what fa4-tune times) on the harness's packed inputs of issue 18's varlen
shape (8 documents, the longest 4096, mean 2048: fa4.problem.varlen_lengths, H16, hd128, bf16),
causal (and with --full not), with each provider's default config; triton do_bench median (warmup 50, rep 300 ms),
TFLOP/s = Problem.flops (the sum over the documents; bwd x 2.5) / time, ours/ref. Then one
harness.measure per row (the per-document check and the tuner's own timing) as a cross-check.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import triton.testing as tt  # noqa: E402

from fa4.arch import SM90  # noqa: E402
from fa4.problem import Problem  # noqa: E402
from providers import get_provider, harness  # noqa: E402

ISSUE = Problem(8, 4096, 4096, 16, 16, 128, 128, causal=True, varlen=True, varlen_mean_q=2048, varlen_mean_k=2048)


def timed(provider, problem):
    q, k, v, do = harness.make_inputs(problem, seed=0)
    cfg = provider.default_config(problem, SM90)
    fn = provider.make_fwd(problem, cfg, q, k, v) if problem.pass_ == "fwd" else provider.make_fwd_bwd(
        problem, cfg, q, k, v, do)
    fn()
    torch.cuda.synchronize()
    return tt.do_bench(fn, warmup=50, rep=300, return_mode="median")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--full", action="store_true", help="the non-causal rows too (more compiles)")
    args = ap.parse_args()
    ours, ref = get_provider("fa4"), get_provider("flash-attn-4")
    print(f"device {torch.cuda.get_device_name()}; lengths {ISSUE.varlen_seqlens()[0]}")
    print(f"{'pass':4s} {'mask':6s} {'fa4 ms':>8s} {'ref ms':>8s} {'fa4 TF/s':>9s} {'ref TF/s':>9s} {'fa4/ref':>8s} "
          f"{'measure fa4 / ref (status, TF/s)':s}")
    rows = []
    for pass_ in ("fwd", "bwd"):
        for causal in (True, False) if args.full else (True,):
            problem = dataclasses.replace(ISSUE, pass_=pass_, causal=causal)
            row = {"problem": problem.key(), "flops": problem.flops}
            for name, p in (("fa4", ours), ("ref", ref)):
                why = p.available() or "; ".join(p.problem_errors(problem))
                if why:
                    row[name] = {"failed": why}
                    continue
                try:
                    ms = timed(p, problem)
                    m = p.measure(problem, None, harness.Settings(check_batches=8))
                    row[name] = {"ms": ms, "tflops": problem.flops / ms / 1e9, "measure": m.status,
                                 "measure_tflops": m.tflops, "error": m.error, "ref_error": m.ref_error,
                                 "reason": m.reason}
                except Exception as e:  # noqa: BLE001 - a row says what failed
                    row[name] = {"failed": f"{type(e).__name__}: {str(e)[:200]}"}
            rows.append(row)
            a, b = row["fa4"], row["ref"]
            if "ms" in a and "ms" in b:
                print(f"{pass_:4s} {'causal' if causal else 'full':6s} {a['ms']:8.3f} {b['ms']:8.3f} {a['tflops']:9.1f} "
                      f"{b['tflops']:9.1f} {b['ms'] / a['ms']:8.3f} {a['measure']} {a['measure_tflops'] or 0:.1f} / "
                      f"{b['measure']} {b['measure_tflops'] or 0:.1f}")
            else:
                print(f"{pass_:4s} {'causal' if causal else 'full':6s} fa4: {a.get('failed', 'ok')} ref: {b.get('failed', 'ok')}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
