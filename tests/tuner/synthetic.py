"""Clearly synthetic recordings for logic tests of the tuner (NOT measurements).

The "TFLOP/s" here come from a made-up smooth formula with one known optimum, so tests can
assert what the tuner should find. Tests against real recorded data use
providers/data/ref_fa4_h200.json instead.
"""

from __future__ import annotations

import json

from fa4.arch import SM90
from fa4.knobs import config_to_dict, iter_configs
from fa4.problem import Problem
from providers.harness import sample_stats, tflops
from providers.flash_attn4 import RefFa4FwdKnobs, fwd_default, fwd_violations
from providers.replay import recording_dict

SYNTHETIC_DEVICE = {
    "name": "SYNTHETIC GPU (test data)",
    "compute_capability": "9.0",
    "sm_count": 132,
    "l2_bytes": 50 * 2**20,
    "memory_bytes": 80 * 2**30,
    "driver": None,
    "cuda": None,
    "torch": None,
    "cutlass_dsl": None,
    "provider_versions": {},
}


def synthetic_tflops(c: RefFa4FwdKnobs) -> float:
    """Made up: peaks at 128x160 RS OL."""
    return 600.0 - 0.8 * abs(c.tile_n - 160) - 40.0 * (c.tile_m != 128) + 12.0 * c.mma_pv_is_rs + 6.0 * c.intra_wg_overlap


# Configs the synthetic recording marks as failing, to exercise those statuses.
COMPILE_ERROR_CFG = RefFa4FwdKnobs(64, 64, True, False)
INCORRECT_CFG = RefFa4FwdKnobs(64, 80, True, False)


def synthetic_recording(problem: Problem) -> dict:
    results = []
    for c in iter_configs(RefFa4FwdKnobs):
        v = fwd_violations(c, problem, SM90)
        entry = {"config": config_to_dict(c), "status": "ok", "reason": None, "samples_ms": [],
                 "median_ms": None, "iqr_ms": None, "tflops": None, "error": None, "ref_error": None}
        if v:
            entry.update(status="infeasible", reason="; ".join(v))
        elif c == COMPILE_ERROR_CFG:
            entry.update(status="compile_error", reason="synthetic compile failure")
        elif c == INCORRECT_CFG:
            entry.update(status="incorrect", reason="synthetic wrong result", error=1.0, ref_error=2e-3)
        else:
            ms = problem.flops / (synthetic_tflops(c) * 1e12) * 1e3
            samples = [ms * (1 + 0.001 * k) for k in (-1, 0, 0, 1, 2)]
            med, iqr = sample_stats(samples)
            entry.update(samples_ms=samples, median_ms=med, iqr_ms=iqr, tflops=tflops(problem, med),
                         error=2.1e-3, ref_error=2.0e-3)
        results.append(entry)
    return {"problem": problem.to_dict(), "default": config_to_dict(fwd_default(problem)), "results": results}


def write_synthetic(path, problems) -> str:
    data = recording_dict("flash-attn-4", SYNTHETIC_DEVICE, {"note": "synthetic"}, {}, [synthetic_recording(p) for p in problems],
                          date="1970-01-01", note="SYNTHETIC numbers for tuner logic tests; not measurements")
    path.write_text(json.dumps(data))
    return str(path)


def best_synthetic(problem: Problem) -> RefFa4FwdKnobs:
    ok = [c for c in iter_configs(RefFa4FwdKnobs) if not fwd_violations(c, problem, SM90)
          and c not in (COMPILE_ERROR_CFG, INCORRECT_CFG)]
    return max(ok, key=synthetic_tflops)
