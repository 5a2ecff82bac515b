"""The per-shape tuning table of the measurements log from `fa4-tune --json` reports.

    fa4-tune --shapes S.csv --json > runs.json; python3 bench/tuning_table.py runs.json [more.json ...]

One row per study: the default's and the served config's TFLOP/s, the gain the interleaved
re-measurement found with its spread (the half-range of the per-round ratios) and whether it is
significant, the trials the study holds (measured ok / in study / feasible configs), wall time.
"""

from __future__ import annotations

import json
import sys

from fa4.problem import Problem


def label(p: Problem) -> str:
    kv = f"/{p.heads_kv}" if p.heads_kv != p.heads_q else ""
    sk = f"/Sk{p.seqlen_k}" if p.seqlen_k != p.seqlen_q else ""
    flags = " causal" if p.causal else ""
    flags += " det" if p.deterministic else ""
    return f"{p.pass_} B{p.batch} Sq{p.seqlen_q}{sk} H{p.heads_q}{kv} d{p.head_dim}{flags}"


def row(r: dict) -> str:
    p = Problem.from_dict(r["problem"])
    d = (r.get("default") or {}).get("tflops")
    best = (r.get("best") or {}).get("tflops")
    served = r.get("served")
    if served is None:
        verdict = "default is the study's best: kept" if best is not None and d is not None and best <= d else "-"
        tuned, gain = d, "-"
    else:
        sig = served["significant"]
        gain = f"{served['gain'] * 100:+.1f}% ± {served['spread'] * 100:.1f}% ({served['rounds']} rounds)"
        verdict = ("challenger kept: " + json.dumps(served["changes"], separators=(",", ":"))) if sig else \
            "no significant gain: default kept"
        tuned = best if sig else d
    ok = (r.get("statuses") or {}).get("ok", 0)
    fmt = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    wall = "-" if r.get("wall_s") is None else f"{r['wall_s']:.0f} s"
    return (f"| {label(p)} | {fmt(d)} | {fmt(tuned)} | {gain} | {verdict} | "
            f"{ok} / {r['trials']} / {r.get('feasible_configs')} | {r.get('statuses', {}).get('infeasible', 0)} | {wall} |")


def main(paths: list[str]) -> int:
    print("| shape | default TFLOP/s | served TFLOP/s | gain (re-measured) | verdict | ok / trials / feasible "
          "| infeasible trials | wall |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        doc = json.load(open(path))
        # One shape's report, a list of them, or the multi-shape document {"results": [...]}.
        reports = doc if isinstance(doc, list) else doc.get("results", [doc])
        for r in reports:
            print(row(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
