"""bench/det_ratio.py on the CPU machine (the GPU and triton faked): our deterministic backward and
its knob variants timed against our non-deterministic one in the same rounds; a variant runs only
where violations() allows it and only if its gradients agree with the default deterministic
kernel's."""

from __future__ import annotations

import torch

from fa4.problem import Problem
from fa4.sm90.bwd_defaults import default_config
from tests.fa4 import cpu_kernels

CAUSAL = Problem(2, 8192, 8192, 16, 16, 128, 128, causal=True, pass_="bwd")


def _run(monkeypatch, problem, variants, times, skew=0.0):
    """det_ratio's row of one shape. ours(cfg) returns fixed gradients (``skew`` added where the
    config stores dS^T early) and records the config; the fake do_bench reports ``times`` of the
    config that ran last: 'nondet', 'det' or a (ds_early, spt_order) pair."""
    mod = cpu_kernels.bench_module(monkeypatch, "det_ratio")
    g = torch.Generator().manual_seed(1)
    grads = tuple(torch.randn(4, 8, generator=g) for _ in range(3))
    ran = []

    def make(det):
        def ours(cfg):
            ran.append((det, cfg))
            return tuple(x + (skew if cfg.ds_early else 0.0) for x in grads)

        ours.problem = Problem(**{**problem.__dict__, "deterministic": det})
        return ours

    def setup(name, det):
        ours = make(det)
        return ours, None, default_config(ours.problem), 1e12

    monkeypatch.setattr(mod.bwd_order, "setup", setup)

    def do_bench(fn, **kw):
        fn()
        det, cfg = ran[-1]
        if not det:
            return times["nondet"]
        return times.get((cfg.ds_early, cfg.spt_order), times["det"])

    monkeypatch.setattr(__import__("triton.testing", fromlist=["do_bench"]), "do_bench", do_bench)
    return mod.ratio_row("causal-8k", 2, variants)


def test_variants_against_the_same_non_deterministic_time(monkeypatch):
    var = {"ds_early": True, "spt_order": False}
    row = _run(monkeypatch, CAUSAL, [var], {"nondet": 1.0, "det": 1.25, (True, False): 1.05})
    assert abs(row["ratio"] - 0.8) < 1e-9
    assert row["skipped"] == {}
    (label, ratio), = row["variants"].items()
    assert label == "det ds_early=True,spt_order=False"
    assert abs(ratio - 1.0 / 1.05) < 1e-9
    assert len(row["ms"][label]) == 2  # one timing per round
    assert abs(row["tflops"][label] - 1e12 / 1.05 / 1e9) < 1e-6


def test_infeasible_variant_is_skipped_with_its_rule(monkeypatch):
    # The compact varlen grid on a dense problem is refused.
    row = _run(monkeypatch, CAUSAL, [{"varlen_grid": "compact"}], {"nondet": 1.0, "det": 1.1})
    assert row["variants"] == {}
    assert "varlen" in row["skipped"]["varlen_grid=compact"]


def test_variant_with_other_gradients_is_not_timed(monkeypatch):
    row = _run(monkeypatch, CAUSAL, [{"ds_early": True}], {"nondet": 1.0, "det": 1.1}, skew=0.5)
    assert row["variants"] == {}
    assert "differ" in row["skipped"]["ds_early=True"]
    assert set(row["ms"]) == {"nondet", "det"}


def test_zero_all_times_the_deterministic_default_with_every_dq_row_zeroed(monkeypatch):
    """--zero-all: the same deterministic config, its launches planned while dq_zero_rows answers
    'every row' (plans of its own, the library's restored after each call), in the same rounds."""
    from fa4.sm90 import bwd_launch

    mod = cpu_kernels.bench_module(monkeypatch, "det_ratio")
    grads = (torch.ones(2), torch.ones(2), torch.ones(2))
    ran = []
    library_plans = bwd_launch._plans, bwd_launch._varlen_plans

    def make(det):
        def ours(cfg):
            # What a plan built now would zero of a deterministic causal 1000 x 333 problem, and
            # whether a varlen plan would zero per sequence.
            rows = bwd_launch.dq_zero_rows(1000, 333, 64, 0)
            per_seq = bwd_launch.varlen_zero_tile(cfg, True)
            own = bwd_launch._plans is library_plans[0] and bwd_launch._varlen_plans is library_plans[1]
            ran.append((det, rows if per_seq else bwd_launch.ZERO_ALL_ROWS, own))
            return grads

        ours.problem = Problem(**{**CAUSAL.__dict__, "deterministic": det})
        return ours

    monkeypatch.setattr(mod.bwd_order, "setup", lambda name, det: (make(det), None, default_config(make(det).problem),
                                                                    1e12))

    def do_bench(fn, **kw):
        fn()
        det, rows, own = ran[-1]
        return 1.0 if not det else (1.2 if rows == bwd_launch.ZERO_ALL_ROWS else 1.1)

    monkeypatch.setattr(__import__("triton.testing", fromlist=["do_bench"]), "do_bench", do_bench)
    row = mod.ratio_row("causal-8k", 2, [], zero_all=True)
    assert abs(row["ratio"] - 1 / 1.1) < 1e-9 and abs(row["variants"]["det zero-all"] - 1 / 1.2) < 1e-9
    assert len(row["ms"]["det zero-all"]) == 2
    # Outside the zero-all calls the library's rows and plans are back: 667 rows see no key (10 tiles).
    assert {r for d, r, own in ran if d and own} == {640}
    assert all(not own for d, r, own in ran if r == bwd_launch.ZERO_ALL_ROWS)
    assert bwd_launch._plans is library_plans[0] and bwd_launch._varlen_plans is library_plans[1]
    assert bwd_launch.dq_zero_rows(1000, 333, 64, 0) == 640 and bwd_launch.varlen_zero_tile(default_config(CAUSAL),
                                                                                            True) == 64
