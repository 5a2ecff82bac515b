"""bench/bwd_order.py's knob variants on the CPU machine (the GPU and triton faked): a variant runs
only where violations() allows it for the shape and only once its gradients agree with the
reference's as the default's do; the table's ratios are the reference's median over ours' best."""

from __future__ import annotations

import sys

import torch

from fa4.problem import Problem
from fa4.sm90.bwd_defaults import default_config
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


def test_served_config_is_read_from_the_verdict_and_timed(monkeypatch, tmp_path):
    """--served DB: the knobs in which the DB's served backward config differs from the shape's
    default are timed as one more variant, and the row names them."""
    import dataclasses

    from fa4.knobs import config_to_dict
    from fa4.sm90.bwd_config import BwdConfigSm90
    from store import ResultsStore

    problem = Problem(2, 8192, 8192, 16, 16, 128, 128, causal=True, pass_="bwd")
    device = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "l2_bytes": 50 << 20,
              "memory_bytes": 141 << 30}
    db = f"sqlite:///{tmp_path / 'served.db'}"
    served_cfg = dataclasses.replace(default_config(problem), ds_early=True, head_swizzle=8)
    with ResultsStore.open(db) as store:
        dev, pid = store.upsert_device(device), store.upsert_problem(problem)
        cid = store.upsert_config("fa4", config_to_dict(served_cfg), BwdConfigSm90)
        mid = store.add_measurement(dev, pid, cid, status="ok", median_ms=2.0, tflops=500.0)
        store.add_verdict(dev, pid, "fa4", measurement_id=mid, significant=True, gain=0.05, spread=0.01,
                          rounds={})
    mod = cpu_kernels.bench_module(monkeypatch, "bwd_order")
    import tuner.device

    monkeypatch.setattr(tuner.device, "cuda_device_info", lambda versions=None: dict(device))
    assert mod.served_overrides(db, problem, default_config(problem)) == {"ds_early": True, "head_swizzle": 8}
    assert mod.served_overrides(db, problem, served_cfg) == {}
    other = Problem(2, 4096, 4096, 16, 16, 128, 128, causal=True, pass_="bwd")
    assert mod.served_overrides(db, other, default_config(other)) is None

    # Through bench_shape: the served variant is timed (ds_early's 2.0 ms against the default's 2.5).
    times = {"ref": 2.0, False: 2.5, True: 2.0}
    setup, ran = _fake_setup(problem, 0.0)
    monkeypatch.setattr(mod, "setup", setup)
    mod_triton = __import__("triton.testing", fromlist=["do_bench"])
    monkeypatch.setattr(mod_triton, "do_bench",
                        lambda fn, **kw: (fn(), times["ref"] if ran[-1] == "ref" else times[ran[-1].ds_early])[1])
    row = mod.bench_shape("causal-8k", [mod.DEFAULT], rounds=2, served_db=db)
    assert row["served"] == "ds_early=True,head_swizzle=8"
    assert abs(row["orders"][row["served"]]["ratio"] - 1.0) < 1e-9
    assert abs(row["orders"]["default"]["ratio"] - 0.8) < 1e-9


def test_served_line_says_why_a_served_config_was_not_timed(monkeypatch, capsys):
    """The table's served line: the ratio when timed, the skip reason when the served config was
    refused (infeasible, or gradients off the reference), never "timed as the default" for those."""
    mod = cpu_kernels.bench_module(monkeypatch, "bwd_order")
    rows = {
        "causal-8k": dict(name="causal-8k", default=dict(spt_order=False, head_swizzle=4), ref_tflops=500.0,
                          orders={"default": dict(ratio=0.95)}, skipped={"ds_early=True": "gradients off the reference"},
                          served="ds_early=True"),
        "qwen2.5-7b-4k": dict(name="qwen2.5-7b-4k", default=dict(spt_order=False, head_swizzle=4), ref_tflops=480.0,
                              orders={"default": dict(ratio=0.98), "head_swizzle=8": dict(ratio=1.01)}, skipped={},
                              served="head_swizzle=8"),
    }
    monkeypatch.setattr(mod, "bench_shape", lambda name, *a, **kw: rows[name])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(sys, "argv", ["bwd_order.py", "--orders", "default", "--served", "sqlite://",
                                      "--shapes", "causal-8k,qwen2.5-7b-4k"])
    mod.main()
    out = capsys.readouterr().out
    assert "served (ds_early=True): not timed: gradients off the reference" in out
    assert "served (head_swizzle=8): 1.010 of the reference" in out
