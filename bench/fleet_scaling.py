"""Fleet scaling on one host: wall time to tune a 6-shape grid with 2 GPUs vs 1, and the winners.

Runs ``fa4-tune --devices 0,1`` and ``fa4-tune --devices 0`` on the same grid (3 sequence
lengths x 2 head dims), each from scratch (its own results DB, Optuna journal and kernel
compile caches), and reports:
  * wall time of each run and the speedup (issue 7's target: >= 1.8x with 2 GPUs);
  * per shape, each run's winner (config, TFLOP/s, IQR) and whether they agree within noise:
    the same config, or TFLOP/s within max(2%, the two winners' relative IQRs added).
    When the configs differ and the 1-GPU run also measured the 2-GPU winner, that
    measurement is shown too (the same config timed by both runs).

The 2-GPU run goes first: whatever warms up along the way (OS file cache, GPU clocks)
helps the 1-GPU run, so the measured speedup is if anything an underestimate.

    python3 bench/fleet_scaling.py                      # both runs, ~6-8 min on 2 H200s
    python3 bench/fleet_scaling.py --runs 2             # one run per command (then --runs 1,
    python3 bench/fleet_scaling.py --runs 1             #  then --report to compare)
    python3 bench/fleet_scaling.py --report
    python3 bench/fleet_scaling.py --virtual --provider replay --seqlens 8192 --hdims 64,128   # no GPU

Writes bench/logs/fleet_scaling/{run_2gpu,run_1gpu}/ (DB, journal, stderr log, run.json) and
bench/logs/fleet_scaling/summary.json, and prints a Markdown block for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file from a checkout: the packages live at the root
OUT = ROOT / "bench" / "logs" / "fleet_scaling"
MIN_NOISE = 0.02
TARGET = 1.8


def devices_for(n: int, virtual: bool = False) -> str:
    return ",".join(f"cpu{i}" if virtual else str(i) for i in range(n))


def run_dir(n: int) -> Path:
    return OUT / f"run_{n}gpu"


def set_out(path: Path) -> None:
    global OUT
    OUT = Path(path)


def tune(n: int, a) -> dict:
    """One fa4-tune run on n GPUs from a clean slate; returns its JSON plus the wall time."""
    d = run_dir(n)
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    env = dict(os.environ)
    # Fresh compile caches: the second run must not reuse kernels the first one compiled.
    for var in ("CUTE_DSL_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        env[var] = str(d / "kernel_cache")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "tuner.cli", "--seqlen", a.seqlens, "--hdim", a.hdims, "--provider", a.provider,
           "--trials", str(a.trials), "--sampler", a.sampler, "--devices", devices_for(n, a.virtual),
           "--db", f"sqlite:///{d / 'results.db'}", "--json"]
    print(f"[fleet_scaling] {n} GPU(s): {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with open(d / "stderr.log", "w") as log:
        p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        tail = (d / "stderr.log").read_text().splitlines()[-15:]
        raise SystemExit(f"fleet_scaling: the {n}-GPU run failed (exit {p.returncode}):\n" + "\n".join(tail))
    doc = json.loads(p.stdout)
    # fa4-tune prints one result for one shape, {"results": [...]} for several.
    results = doc["results"] if "results" in doc else [{k: v for k, v in doc.items() if k not in ("workers", "push")}]
    run = {"gpus": n, "wall_s": wall, "command": " ".join(cmd[1:]), "results": results,
           "workers": doc.get("workers"), "db": str(d / "results.db"),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    (d / "run.json").write_text(json.dumps(run, indent=2, default=str))
    print(f"[fleet_scaling] {n} GPU(s): {wall:.1f} s", file=sys.stderr, flush=True)
    return run


def load_run(n: int) -> dict | None:
    p = run_dir(n) / "run.json"
    return json.loads(p.read_text()) if p.exists() else None


def rel_iqr(row: dict | None) -> float:
    if not row or not row.get("iqr_ms") or not row.get("median_ms"):
        return 0.0
    return row["iqr_ms"] / row["median_ms"]


def measured_in(run: dict, study_name: str, config: dict) -> float | None:
    """The best TFLOP/s ``run`` measured for ``config`` in that study (None if never measured ok)."""
    from store import ResultsStore

    with ResultsStore.open(f"sqlite:///{run['db']}") as store:
        vals = [r["tflops"] for r in store.measurements(study_name=study_name, status="ok")
                if r["config"] == config and r["tflops"] is not None]
    return max(vals) if vals else None


def compare(one: dict, two: dict) -> dict:
    from fa4.problem import Problem

    by_key = {Problem.from_dict(r["problem"]).key(): r for r in one["results"]}
    shapes = []
    for r2 in two["results"]:
        p = Problem.from_dict(r2["problem"])
        r1 = by_key.get(p.key())
        b1, b2 = (r1 or {}).get("best"), r2.get("best")
        row = {"shape": f"s{p.seqlen_q} d{p.head_dim}{' causal' if p.causal else ''}", "key": p.key(),
               "best_1": b1, "best_2": b2, "same_config": bool(b1 and b2 and b1["config"] == b2["config"])}
        if b1 and b2:
            diff = abs(b1["tflops"] - b2["tflops"]) / max(b1["tflops"], b2["tflops"])
            noise = max(MIN_NOISE, rel_iqr(b1) + rel_iqr(b2))
            row.update(rel_diff=diff, noise=noise, agree=row["same_config"] or diff <= noise)
            if not row["same_config"]:
                row["best_2_as_measured_by_1"] = measured_in(one, r1["study_name"], b2["config"])
        else:
            row.update(rel_diff=None, noise=None, agree=False)
        shapes.append(row)
    speedup = one["wall_s"] / two["wall_s"]
    return {"wall_1_s": one["wall_s"], "wall_2_s": two["wall_s"], "speedup": speedup,
            "target": TARGET, "meets_target": speedup >= TARGET, "shapes": shapes,
            "all_agree": all(s["agree"] for s in shapes), "commands": [two["command"], one["command"]],
            "device": two["results"][0]["device"] if two["results"] else None,
            "provider": two["results"][0]["provider"] if two["results"] else None,
            "trials": two["results"][0]["trials"] if two["results"] else None,
            "sampler": two["results"][0]["sampler"] if two["results"] else None,
            "date": two["date"]}


def markdown(c: dict, a) -> str:
    lines = [
        f"**Fleet scaling ({c['date'][:10]}, {c['device']} x2, provider {c['provider']}, "
        f"{len(c['shapes'])}-shape grid, {c.get('trials') or a.trials} {c.get('sampler') or a.sampler} "
        "trials per shape)**",
        "",
        f"- wall time: 1 GPU {c['wall_1_s']:.1f} s, 2 GPUs {c['wall_2_s']:.1f} s: **{c['speedup']:.2f}x** "
        f"(target >= {TARGET}x: {'met' if c['meets_target'] else 'NOT met'})",
        f"- winners agree within noise on {sum(s['agree'] for s in c['shapes'])} of {len(c['shapes'])} shapes",
        "",
        "| shape | 1-GPU winner | TFLOP/s | 2-GPU winner | TFLOP/s | diff | noise | agree |",
        "|---|---|---:|---|---:|---:|---:|---|",
    ]
    for s in c["shapes"]:
        b1, b2 = s["best_1"] or {}, s["best_2"] or {}
        same = "(same)" if s["same_config"] else b2.get("label", "-")
        extra = ""
        if s.get("best_2_as_measured_by_1") is not None:
            extra = f" (1-GPU run measured it at {s['best_2_as_measured_by_1']:.1f})"
        fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
        lines.append(f"| {s['shape']} | {b1.get('label', '-')} | {fmt(b1.get('tflops'), '.1f')} | {same}{extra} | "
                     f"{fmt(b2.get('tflops'), '.1f')} | {fmt(s['rel_diff'] and 100 * s['rel_diff'], '.1f')}% | "
                     f"{fmt(s['noise'] and 100 * s['noise'], '.1f')}% | {'yes' if s['agree'] else 'NO'} |")
    lines += ["", "Reproduce: `python3 bench/fleet_scaling.py " + " ".join(a.argv) + "`; runs: "
              + "; ".join(f"`fa4-tune {cmd.split('tuner.cli ', 1)[-1]}`" for cmd in c["commands"])]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # fa4-tune's own default (our kernels): the workload users run. Its trials compile more distinct
    # kernels than the reference's four knobs do, so the fixed start-up share of a run is smaller.
    ap.add_argument("--provider", default="fa4", help="provider to tune (default fa4, as fa4-tune; "
                    "flash-attn-4 for the reference)")
    ap.add_argument("--seqlens", default="1024,2048,4096")
    ap.add_argument("--hdims", default="64,128")
    # 40 = fa4-tune's default. At 20 the fixed start-up cost (13-16 s, paid by every worker in
    # parallel) was 11-15% of a 1-GPU run, which caps 2 GPUs below 1.8x whatever the trials scale
    # (session 5: trial phase 1.90x, whole run 1.63x).
    ap.add_argument("--trials", type=int, default=40, help="trials per shape (default 40, as fa4-tune)")
    ap.add_argument("--sampler", default="tpe", choices=("tpe", "random", "grid"))
    ap.add_argument("--runs", default="2,1", help="which runs to make now: 2,1 (default), 2 or 1")
    ap.add_argument("--report", action="store_true", help="only compare the runs already on disk")
    ap.add_argument("--virtual", action="store_true",
                    help="virtual cpu slots instead of GPUs (with --provider replay: this script without a GPU)")
    ap.add_argument("--out", help=f"where runs and the summary go (default {OUT.relative_to(ROOT)}; "
                    "with --virtual a temp dir)")
    a = ap.parse_args(argv)
    # For the "Reproduce" line: the options that shape the runs, not which half ran when.
    raw = list(argv if argv is not None else sys.argv[1:])
    a.argv = []
    skip = False
    for x in raw:
        if skip or x == "--report":
            skip = False
            continue
        if x == "--runs":
            skip = True
            continue
        if not x.startswith("--runs="):
            a.argv.append(x)
    if a.out or a.virtual:
        import tempfile

        set_out(Path(a.out) if a.out else Path(tempfile.gettempdir()) / "fa4_fleet_scaling_virtual")
    runs = [] if a.report else [int(x) for x in a.runs.split(",")]
    if runs and not a.virtual:
        import torch

        need = max(runs)
        if torch.cuda.device_count() < need:
            raise SystemExit(f"fleet_scaling: needs {need} visible GPUs, found {torch.cuda.device_count()}")
    for n in runs:
        tune(n, a)
    one, two = load_run(1), load_run(2)
    if one is None or two is None:
        print("fleet_scaling: run both --runs 2 and --runs 1 to compare", file=sys.stderr)
        return 0
    c = compare(one, two)
    (OUT / "summary.json").write_text(json.dumps(c, indent=2, default=str))
    print(markdown(c, a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
