"""The providers measuring packed varlen problems on the GPU: harness.measure (packed inputs, the
fp32 reference per document, the FLOPs over the documents) with fa4's varlen kernels under a
default and a non-default config, both passes, and the reference FA4's varlen path."""

from __future__ import annotations

import dataclasses

import pytest

from fa4.arch import SM90
from fa4.problem import Problem
from providers import get_provider
from providers.harness import OK, Settings

# Issue 18's mix at a quarter of the size: 4 documents, the longest 2048, mean 1024 (8k tokens).
PACKED = Problem(4, 2048, 2048, 8, 8, 128, 128, causal=True, varlen=True, varlen_mean_q=1024, varlen_mean_k=1024)
GQA_WINDOW = Problem(5, 1500, 1500, 8, 2, 64, 64, window_left=300, window_right=0, varlen=True, varlen_mean_q=700,
                     varlen_mean_k=700)
# Every document compared against the reference, with few timing reps (the check is the point).
SETTINGS = Settings(target_ms=20, min_reps=3, max_reps=20, warmup_ms=20, check_batches=8, check_heads=2)


def _measure(name, problem, config=None):
    p = get_provider(name)
    assert p.problem_errors(problem) == []
    m = p.measure(problem, config, SETTINGS)
    assert m.status == OK, m.reason
    assert m.error <= 2 * m.ref_error + SETTINGS.atol
    assert m.tflops == pytest.approx(problem.flops / (m.median_ms * 1e-3) / 1e12)
    return m


@pytest.mark.gpu
@pytest.mark.parametrize("problem", [PACKED, GQA_WINDOW], ids=["causal", "gqa-window"])
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_fa4_measures_varlen_with_its_default(problem, pass_):
    _measure("fa4", dataclasses.replace(problem, pass_=pass_))


@pytest.mark.gpu
def test_fa4_measures_varlen_with_a_tuned_config():
    p = get_provider("fa4")
    fwd = p.default_config(PACKED, SM90)
    changed = dataclasses.replace(fwd, tile_n=96 if fwd.tile_n != 96 else 128)
    assert not p.violations(changed, PACKED, SM90)
    _measure("fa4", PACKED, changed)
    bwd_problem = dataclasses.replace(PACKED, pass_="bwd", deterministic=True)
    bwd = p.default_config(bwd_problem, SM90)
    changed = dataclasses.replace(bwd, dkv_store="direct" if bwd.dkv_store != "direct" else "tma")
    assert not p.violations(changed, bwd_problem, SM90), p.violations(changed, bwd_problem, SM90)
    _measure("fa4", bwd_problem, changed)


@pytest.mark.gpu
@pytest.mark.ref
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_reference_fa4_measures_varlen(pass_):
    _measure("flash-attn-4", dataclasses.replace(PACKED, pass_=pass_))
