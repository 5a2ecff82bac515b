"""bench/bwd_order.py's knob variants on the CPU machine (the GPU and triton faked): a variant runs
only where violations() allows it for the shape and only once its gradients agree with the
reference's as the default's do; the table's ratios are the reference's median over ours' best."""

from __future__ import annotations

import torch

from fa4.problem import Problem
from fa4.sm90.bwd_config import default_config
from tests.fa4 import cpu_kernels


def _fake_setup(problem, skew):
    """setup(name, det) of one shape: ours(cfg) returns the reference's gradients (``skew`` added
    where ``cfg.ds_early``) and records which config ran (the fake do_bench times the last one)."""
    g = torch.Generator().manual_seed(1)
    grads = tuple(torch.randn(4, 8, generator=g) for _ in range(3))
    ran = []

    def ours(cfg):
        ran.append(cfg)
        return tuple(x + (skew if cfg.ds_early else 0.0) for x in grads)

    ours.problem = problem

    def ref():
        ran.append("ref")
        return grads

    config = default_config(problem)
    return (lambda name, det: (ours, ref, config, 1e12)), ran


def _run(monkeypatch, problem, variants, skew=0.0):
    mod = cpu_kernels.bench_module(monkeypatch, "bwd_order")
    times = {"ref": 2.0, False: 2.5, True: 2.0}
    setup, ran = _fake_setup(problem, skew)
    monkeypatch.setattr(mod, "setup", setup)
    # do_bench: the time of whatever the timed function ran.
    mod_triton = __import__("triton.testing", fromlist=["do_bench"])

    def do_bench(fn, **kw):
        fn()
        last = ran[-1]
        return times["ref"] if last == "ref" else times[last.ds_early]

    monkeypatch.setattr(mod_triton, "do_bench", do_bench)
    orders = [mod.DEFAULT] + [dict(v) for v in variants]
    return mod, mod.bench_shape("causal-8k", orders, rounds=2)


def test_variant_timed_beside_default_against_the_reference(monkeypatch):
    problem = Problem(2, 8192, 8192, 16, 16, 128, 128, causal=True, pass_="bwd")
    mod, row = _run(monkeypatch, problem, [{"ds_early": True}])
    assert row["skipped"] == {}
    # Reference 2.0 ms, ours' default 2.5 ms, ds_early 2.0 ms: ratios ref / ours.
    assert abs(row["orders"]["default"]["ratio"] - 0.8) < 1e-9
    assert abs(row["orders"]["ds_early=True"]["ratio"] - 1.0) < 1e-9
    assert len(row["orders"]["ds_early=True"]["ms"]) == 2  # one timing per round
    assert abs(row["orders"]["ds_early=True"]["tflops"] - 1e12 / 2.0 / 1e9) < 1e-6


def test_infeasible_variant_is_skipped_with_its_rule(monkeypatch):
    # hd256 runs dkv_split 'head_dim', where ds_early is refused by violations().
    problem = Problem(2, 8192, 8192, 8, 8, 256, 256, causal=True, pass_="bwd")
    mod, row = _run(monkeypatch, problem, [{"ds_early": True}])
    assert "ds_early=True" not in row["orders"]
    assert "ds_early" in row["skipped"]["ds_early=True"]
    assert "default" in row["orders"]


def test_variant_with_wrong_gradients_is_not_timed(monkeypatch):
    problem = Problem(2, 8192, 8192, 16, 16, 128, 128, causal=True, pass_="bwd")
    mod, row = _run(monkeypatch, problem, [{"ds_early": True}], skew=0.5)
    assert "ds_early=True" not in row["orders"]
    assert "gradients off the reference" in row["skipped"]["ds_early=True"]
