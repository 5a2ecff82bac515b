"""The fa4-decode provider on the GPU: a measured decode step passes the fp32 check at several split
counts and a wrong output is caught."""

from __future__ import annotations

import dataclasses

import pytest

from fa4.arch import SM90
from fa4.decode_problem import DecodeProblem
from providers import get_provider
from providers.harness import Settings

pytestmark = pytest.mark.gpu

QUICK = Settings(target_ms=20, min_reps=5, max_reps=20, warmup_ms=10, check_batches=2, check_heads=8)


@pytest.mark.parametrize("splits", [0, 1, 3, 8])
@pytest.mark.parametrize("prob", [
    DecodeProblem(batch=2, seqlen_q=1, seqlen_k=4096, heads_q=32, heads_kv=8, head_dim=128, page_size=256),
    DecodeProblem(batch=3, seqlen_q=4, seqlen_k=1000, heads_q=8, heads_kv=2, head_dim=64, page_size=0, causal=True),
], ids=lambda p: p.key())
def test_measured_step_is_checked_and_timed(prob, splits):
    p = get_provider("fa4-decode")
    cfg = dataclasses.replace(p.default_config(prob, SM90), num_splits=splits)
    m = p.measure(prob, cfg, QUICK)
    assert m.status == "ok", m.reason
    assert m.error <= 2 * m.ref_error + QUICK.atol and m.ref_error > 0
    assert m.tflops == pytest.approx(prob.kv_bytes / (m.median_ms * 1e-3) / 1e12)


def test_a_wrong_output_is_incorrect(monkeypatch):
    p = get_provider("fa4-decode")
    prob = DecodeProblem(batch=1, seqlen_q=1, seqlen_k=2048, heads_q=32, heads_kv=8, head_dim=128, page_size=256)
    real = p.make_decode

    def half_the_keys(problem, config, q, k, v, seqlens, table):
        return real(problem, config, q, k, v, seqlens // 2, table)  # attends to half of each cache

    monkeypatch.setattr(p, "make_decode", half_the_keys)
    m = p.measure(prob, p.default_config(prob, SM90), QUICK)
    assert m.status == "incorrect", (m.status, m.reason)
