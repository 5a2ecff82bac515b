"""Side-by-side forward throughput of the providers, and each one's ratio to the reference FA4.

Uses the tuner's harness (correctness gate, warm clocks, L2 flush, CUDA events) in an isolated
worker, each provider at its default config (or the one given with --config for one provider).
Shapes follow the benchmark convention: batch*seqlen = 16k tokens, heads*head_dim = 2048, bf16.

    python3 bench/bench_fwd.py
    python3 bench/bench_fwd.py --providers fa4,flash-attn-4 --seqlens 8192 --hdims 128 --out json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fa4.problem import Problem  # noqa: E402
from tuner.device import cuda_device_info, has_cuda  # noqa: E402
from providers.harness import Settings  # noqa: E402
from providers import get_provider, list_providers  # noqa: E402
from tuner.worker import IsolatedRunner  # noqa: E402

REFERENCE = "flash-attn-4"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_providers = [p for p in ("fa4", "flash-attn-4", "cudnn", "fa2") if p in list_providers()]
    ap.add_argument("--providers", default=",".join(default_providers))
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--causal", choices=("no", "yes", "both"), default="both")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--out", choices=("table", "json"), default="table")
    ap.add_argument("--save", help="also write the JSON to this file")
    ap.add_argument("--target-ms", type=float, default=200.0, help="timed work per measurement")
    args = ap.parse_args(argv)

    if not has_cuda():
        print("bench_fwd: needs a CUDA GPU", file=sys.stderr)
        return 2
    names = [p for p in args.providers.split(",") if p]
    providers = {}
    for n in names:
        p = get_provider(n)
        why = p.available()
        if why:
            print(f"bench_fwd: skipping {n}: {why}", file=sys.stderr)
        else:
            providers[n] = p
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    settings = Settings(target_ms=args.target_ms)
    rows = []
    with IsolatedRunner() as runner:
        for hd in (int(x) for x in args.hdims.split(",")):
            for causal in causals:
                for s in (int(x) for x in args.seqlens.split(",")):
                    prob = Problem.standard(s, hd, causal=causal, dtype=args.dtype)
                    row = {"seqlen": s, "hdim": hd, "causal": causal, "problem": prob.to_dict(), "results": {}}
                    for n, p in providers.items():
                        errs = p.problem_errors(prob)
                        if errs:
                            row["results"][n] = {"status": "unsupported", "reason": "; ".join(errs)}
                            continue
                        m = runner.run(n, prob, None, settings)
                        row["results"][n] = {k: getattr(m, k) for k in ("status", "reason", "tflops", "median_ms", "iqr_ms", "error")}
                    ref = row["results"].get(REFERENCE, {}).get("tflops")
                    for r in row["results"].values():
                        r["ratio_vs_ref"] = (r["tflops"] / ref) if (ref and r.get("tflops")) else None
                    rows.append(row)
                    if args.out == "table":
                        print(_line(row, providers), flush=True)
    info = cuda_device_info({n: p.versions() for n, p in providers.items()})
    doc = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": info,
           "settings": settings.to_dict(), "rows": rows}
    if args.save:
        Path(args.save).write_text(json.dumps(doc, indent=1) + "\n")
    if args.out == "json":
        print(json.dumps(doc, indent=1))
    else:
        print(f"\n{info['name']}, {doc['date']}; TFLOP/s (ratio to {REFERENCE}); '-' = not ok")
        from fa4.fingerprint import source_fingerprint

        print(f"fa4 source: {source_fingerprint()}")
    return 0


_header_done = False


def _line(row, providers) -> str:
    global _header_done
    cells = []
    for n in providers:
        r = row["results"][n]
        if r.get("tflops"):
            ratio = f" ({r['ratio_vs_ref']:.2f})" if r.get("ratio_vs_ref") and n != REFERENCE else ""
            cells.append(f"{r['tflops']:7.1f}{ratio:>7}")
        else:
            cells.append(f"{'- ' + r['status'][:12]:>14}")
    head = ""
    if not _header_done:
        _header_done = True
        head = f"{'S':>6} {'hd':>4} {'causal':>6} " + " ".join(f"{n:>14}" for n in providers) + "\n"
    return head + f"{row['seqlen']:>6} {row['hdim']:>4} {'yes' if row['causal'] else 'no':>6} " + " ".join(cells)


if __name__ == "__main__":
    sys.exit(main())
