"""Record the reference FA4's forward knob sweep on this GPU, for the replay provider.

Every config of the reference's sm90 knob space is either rejected by our feasibility rules
(stored as infeasible with the reason, no GPU time) or measured with the tuner's harness in an
isolated worker (correctness gate, warm clocks, L2 flush, CUDA events). The result is the
JSON file providers/data/ref_fa4_h200.json that `--provider replay` serves, so the tuner's logic
is tested on CPU against real numbers.

Compilation dominates (one kernel per config and shape), so feasible configs are first
compiled in parallel on fake tensors into the reference's persistent JIT cache; the timing
worker then loads them instead of compiling.

    python3 bench/sweep_ref_fa4.py                      # S=8192, hd 64/128, causal no/yes
    python3 bench/sweep_ref_fa4.py --seqlens 4096,8192 --hdims 128 --causal no --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fa4.arch import SM90  # noqa: E402
from fa4.knobs import config_to_dict, iter_configs  # noqa: E402
from fa4.problem import Problem  # noqa: E402
from tuner.device import cuda_device_info, has_cuda  # noqa: E402
from providers.harness import INFEASIBLE, Settings  # noqa: E402
from providers import get_provider  # noqa: E402
from providers.replay import DEFAULT_RECORDING, recording_dict  # noqa: E402
from tuner.worker import IsolatedRunner  # noqa: E402

PROVIDER = "flash-attn-4"
SETTINGS = Settings(target_ms=80, min_reps=10, max_reps=100, warmup_ms=40, check_heads=1, timeout_s=300)


def _compile_one(problem_dict: dict, config_dict: dict) -> tuple[dict, dict, str | None, float]:
    p = get_provider(PROVIDER)
    prob = Problem.from_dict(problem_dict)
    t0 = time.perf_counter()
    err = p.compile_only(prob, p.config_from_dict(prob, config_dict), SM90)
    return problem_dict, config_dict, err, time.perf_counter() - t0


def parse_list(text: str, cast=int) -> list:
    return [cast(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", default="8192")
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--causal", choices=("no", "yes", "both"), default="both")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="parallel compile processes")
    ap.add_argument("--max-minutes", type=float, default=12.0, help="stop measuring after this (file marked incomplete)")
    ap.add_argument("--out", default=str(DEFAULT_RECORDING))
    args = ap.parse_args(argv)

    provider = get_provider(PROVIDER)
    why = provider.available()
    if why or not has_cuda():
        print(f"sweep_ref_fa4: needs a CUDA GPU and the reference FA4: {why or 'no CUDA GPU'}", file=sys.stderr)
        return 2
    # Persistent JIT cache shared by the compile pool and the timing worker (inherited env).
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", tempfile.mkdtemp(prefix="fa4-sweep-cache-"))

    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    problems = [Problem.standard(s, d, causal=c) for s in parse_list(args.seqlens)
                for d in parse_list(args.hdims) for c in causals]
    plan = []  # (problem, config, violations)
    for prob in problems:
        for cfg in iter_configs(provider.knob_cls_for(prob)):
            plan.append((prob, cfg, provider.violations(cfg, prob, SM90)))
    feasible = [(p, c) for p, c, v in plan if not v]
    print(f"{len(problems)} shapes, {len(plan)} configs, {len(feasible)} feasible; compiling with {args.jobs} processes")

    t_start = time.perf_counter()
    compile_errors: dict[tuple[str, str], str] = {}
    with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        futs = [pool.submit(_compile_one, p.to_dict(), config_to_dict(c)) for p, c in feasible]
        for i, f in enumerate(cf.as_completed(futs), 1):
            pd, cd, err, secs = f.result()
            if err:
                compile_errors[(json.dumps(pd, sort_keys=True), json.dumps(cd, sort_keys=True))] = err
            if i % 25 == 0 or i == len(futs):
                print(f"  compiled {i}/{len(futs)} ({len(compile_errors)} errors), {time.perf_counter() - t_start:.0f} s")
    t_compiled = time.perf_counter()

    entries = {p.key(): {"problem": p.to_dict(), "default": config_to_dict(provider.default_config(p, SM90)),
                         "results": []} for p in problems}
    complete = True
    deadline = t_start + args.max_minutes * 60
    with IsolatedRunner() as runner:
        for prob, cfg, viol in plan:
            cd = config_to_dict(cfg)
            row = {"config": cd, "status": INFEASIBLE, "reason": "; ".join(viol), "samples_ms": [],
                   "median_ms": None, "iqr_ms": None, "tflops": None, "error": None, "ref_error": None}
            if not viol:
                if time.perf_counter() > deadline:
                    complete = False
                    continue
                m = runner.run(PROVIDER, prob, cd, SETTINGS)
                row.update(m.to_dict())
                key = (json.dumps(prob.to_dict(), sort_keys=True), json.dumps(cd, sort_keys=True))
                if m.status != "ok" and key in compile_errors:
                    row["reason"] = f"{row['reason']} (offline compile: {compile_errors[key]})"
                tf = f"{m.tflops:6.1f}" if m.tflops else m.status
                print(f"  {prob.key()} {provider.describe(cfg):>16}: {tf}")
            entries[prob.key()]["results"].append(row)
        restarts = runner.restarts
    t_end = time.perf_counter()

    info = cuda_device_info(provider.versions())
    import torch

    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "cutlass_dsl": info["cutlass_dsl"],
                **provider.versions()}
    data = recording_dict(
        PROVIDER, info, versions, SETTINGS.to_dict(), list(entries.values()),
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        note=(f"bench/sweep_ref_fa4.py {' '.join(argv or sys.argv[1:])}; compile {t_compiled - t_start:.0f} s, "
              f"measure {t_end - t_compiled:.0f} s, worker restarts {restarts}"),
    )
    data["complete"] = complete
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")

    print(f"\nwrote {args.out} ({'complete' if complete else 'INCOMPLETE: --max-minutes reached'})")
    print(f"{'shape':<64} {'default':>8} {'best':>8}  best config")
    for e in entries.values():
        ok = [r for r in e["results"] if r["status"] == "ok"]
        d = next((r for r in ok if r["config"] == e["default"]), None)
        b = max(ok, key=lambda r: r["tflops"], default=None)
        label = provider.describe(provider.config_from_dict(Problem.from_dict(e["problem"]), b["config"])) if b else "-"
        print(f"{Problem.from_dict(e['problem']).key():<64} {d['tflops'] if d else float('nan'):8.1f} "
              f"{b['tflops'] if b else float('nan'):8.1f}  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
