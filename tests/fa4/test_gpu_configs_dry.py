"""The GPU tests run dry on the CPU: every case of the suites that go through bench/check_bwd.py,
bench/check_bwd_feat.py or (the forward's) bench/check_fwd.py, with its GPU run (check_case,
check_deterministic) replaced by the feasibility check of the config it would launch; the CUDA
tensors a test makes to resolve a default are made on the meta device (shapes and dtypes only).

Those tests derive their configs from the problem's default, which moves when a default does: a
case that turns one knob on can meet another knob's default that violations() refuses beside it,
and that was seen only on a GPU, sessions later (session 37's stat_shuffle default at hd64 against
test_bwd_gpu's 'last_cta' cases, session 30's q_starts 16 at hd256 against test_bwd_qm_gpu's 'loop'
case; both found in session 42; and the feature suites ran the default of the problem without its
window, which violations() refuses with it). Here the test functions themselves run, on every parameter of
their pytest.mark.parametrize, so CI sees such a change the day it lands.

A test of these modules that needs the GPU beyond those runs (autograd on CUDA tensors,
torch.compile, the custom ops, the kernels' outputs compared directly) is listed in GPU_ONLY with
why; any other error fails here, so a new GPU test either runs dry or is listed.
"""

from __future__ import annotations

import importlib
import inspect
import itertools

import pytest

from fa4.sm90.bwd_config import violations
from tests.fa4 import cpu_kernels

MODULES = ("test_bwd_gpu", "test_bwd_qm_gpu", "test_bwd_cluster_gpu", "test_bwd_q_starts_gpu",
           "test_bwd_walk_down_gpu", "test_bwd_feat_gpu", "test_bwd_gqa_loop_gpu", "test_fwd_gpu")
# Tests whose configs come from fa4's own resolution (the problem's default, no knob changed) and
# whose GPU work is not check_bwd's: CUDA tensors through autograd, torch.compile or the custom ops;
# and two that compare the kernels' outputs themselves (run_ours), whose configs the other cases of
# their module cover (loop_config; the default).
GPU_ONLY = {
    "test_bwd_gpu": {"test_autograd_grads_match_reference", "test_autograd_deterministic_bitwise_over_10_backwards",
                     "test_explicit_bwd_config_is_the_one_run", "test_non_contiguous_dout",
                     "test_torch_compile_fullgraph_fwd_bwd_equals_eager", "test_custom_ops_opcheck",
                     "test_torch_compile_fullgraph_with_features_equals_eager",
                     "test_later_head_dims_through_flash_attn_func"},
    "test_bwd_feat_gpu": {"test_rows_that_see_no_key"},
    "test_bwd_gqa_loop_gpu": {"test_loop_matches_atomic"},
}


class DryRun:
    """A reference module (bench/check_*.py) whose GPU runs are replaced by ``check``: every other
    attribute is the module's own; ``checked`` keeps each (problem, config) a run was asked for."""

    def __init__(self, real):
        self._real = real
        self.checked: list[tuple] = []

    def __getattr__(self, name):
        return getattr(self._real, name)

    def check(self, prob, config, violations_of=violations):
        """check_case's (ok, info) for ``config`` on ``prob``, decided by ``violations_of`` alone."""
        bad = violations_of(config, prob)
        self.checked.append((prob, config))
        return not bad, {"infeasible": [str(b) for b in bad]}


class DryCheckBwd(DryRun):
    """bench/check_bwd.py whose two GPU runs only resolve the problem and check the config."""

    def check_case(self, B, Sq, Sk, Hq, Hkv, D, causal, dtype, config, deterministic=False):
        return self.check(self._real.problem_for((B, Sq, Sk, Hq, Hkv), D, causal, deterministic), config)

    def check_deterministic(self, B, Sq, Sk, Hq, Hkv, D, causal, dtype, config, deterministic=True, runs=10):
        return self.check(self._real.problem_for((B, Sq, Sk, Hq, Hkv), D, causal, deterministic), config)


class DryFeat(DryRun):
    """bench/check_bwd_feat.py whose two GPU runs only resolve the problem, with its features, and
    check the config: where the test names none, the one run_ours takes (the module's default_for)."""

    def _check(self, B, Sq, Sk, Hq, Hkv, d, dtype, causal, sink, deterministic, config, feat):
        import torch

        from fa4.tensors import problem_of

        q, k = (torch.empty(B, s, h, d, device="meta", dtype=dtype or torch.bfloat16) for s, h in ((Sq, Hq), (Sk, Hkv)))
        features = self._real.problem_features(feat)
        if config is None:
            config = self._real.default_for(q, k, k, causal, deterministic, **features, sink=sink)
        return self.check(problem_of(q, k, k, causal, pass_="bwd", deterministic=deterministic, sink=sink, **features),
                          config)

    def check_case(self, B, Sq, Sk, Hq, Hkv, d, dtype=None, causal=False, sink=False, dlse=False,
                   deterministic=False, config=None, device="cuda", seed=None, **feat):
        return self._check(B, Sq, Sk, Hq, Hkv, d, dtype, causal, sink, deterministic, config, feat)

    def check_deterministic(self, B, Sq, Sk, Hq, Hkv, d, dtype=None, causal=False, sink=False, runs=10,
                            config=None, dlse=True, **feat):
        return self._check(B, Sq, Sk, Hq, Hkv, d, dtype, causal, sink, True, config, feat)


class DryCheckFwd(DryRun):
    """bench/check_fwd.py whose GPU run only checks the forward config for the problem it poses."""

    def check_case(self, B, Sq, Sk, Hq, Hkv, D, causal, dtype, config, scale_mult=1.0, Dv=None):
        from fa4.problem import Problem
        from fa4.sm90.fwd_config import violations as fwd_violations
        from fa4.tensors import DTYPES

        return self.check(Problem(B, Sq, Sk, Hq, Hkv, D, Dv or D, dtype=DTYPES[dtype], causal=causal), config,
                          fwd_violations)


def check_fwd_module():
    """bench/check_fwd.py as a module, as test_fwd_gpu's fixture loads it."""
    import importlib.util

    from tests.fa4 import test_fwd_gpu

    mod = importlib.util.module_from_spec(test_fwd_gpu._spec)
    test_fwd_gpu._spec.loader.exec_module(mod)
    return mod


def on_meta(monkeypatch):
    """torch.empty(..., device="cuda") made on the meta device: the tests make such tensors only to
    resolve a problem's default (shapes and dtype)."""
    import torch

    real = torch.empty

    def empty(*size, device=None, **kw):
        return real(*size, device="meta" if str(device).startswith("cuda") else device, **kw)

    monkeypatch.setattr(torch, "empty", empty)


def parameter_sets(fn) -> list[dict]:
    """Every call pytest makes of ``fn``: the product of its parametrize marks' values."""
    axes = []
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        # pytest.param(...) holds its values as a tuple, one name's too.
        values = [(v.values if len(names) > 1 else v.values[0]) if type(v).__name__ == "ParameterSet" else v
                  for v in mark.args[1]]
        axes.append([dict(zip(names, v if len(names) > 1 else (v,))) for v in values])
    return [{k: v for part in combo for k, v in part.items()} for combo in itertools.product(*axes)]


def dry_tests(modname: str) -> list:
    mod = importlib.import_module(f"tests.fa4.{modname}")
    return [(name, fn) for name, fn in vars(mod).items()
            if name.startswith("test_") and callable(fn) and name not in GPU_ONLY.get(modname, ())]


@pytest.mark.parametrize("modname", MODULES)
def test_every_case_of_the_gpu_suite_launches_a_feasible_config(modname, monkeypatch):
    fixtures = {"check_bwd": (DryCheckBwd, cpu_kernels.check_bwd()), "feat": (DryFeat, cpu_kernels.check_bwd_feat()),
                "check_fwd": (DryCheckFwd, check_fwd_module())}
    tests = dry_tests(modname)
    assert tests
    on_meta(monkeypatch)
    failures, checked = [], 0
    for name, fn in tests:
        params = set(inspect.signature(fn).parameters)
        cases = parameter_sets(fn) or [{}]
        # Every argument is a parameter or a reference fixture: else the test belongs in GPU_ONLY.
        assert params - set(fixtures) <= set(cases[0]), (name, params)
        for case in cases:
            dry = {n: cls(real) for n, (cls, real) in fixtures.items() if n in params}
            try:
                fn(**dry, **case)
            except AssertionError as e:
                failures.append(f"{name}{case}: {(str(e).splitlines() or [''])[0][:300]}")
                continue
            # A case that reached no GPU run checked nothing here: it belongs in GPU_ONLY.
            runs = sum(len(d.checked) for d in dry.values())
            assert runs, f"{name}{case} reached no check_case or check_deterministic run"
            checked += runs
    assert not failures, "\n".join(failures)
    assert checked >= len(tests)


def test_the_dry_check_refuses_an_infeasible_config():
    """A config violations() refuses fails the dry run as the GPU run's own check would."""
    import dataclasses

    real = cpu_kernels.check_bwd()
    dry = DryCheckBwd(real)
    shape = (2, 1000, 1000, 8, 2)
    good = real.default_for(shape, 64, True, False)
    assert good.stat_shuffle  # the hd64 default, which 'last_cta' does not take
    ok, info = dry.check_case(*shape, 64, True, None, good)
    assert ok and info == {"infeasible": []}
    bad = dataclasses.replace(good, gqa_reduce="atomic", gqa_finish="last_cta")
    ok, info = dry.check_case(*shape, 64, True, None, bad)
    assert not ok and "stat_shuffle" in info["infeasible"][0]
    assert dry.checked == [(real.problem_for(shape, 64, True, False), good), (real.problem_for(shape, 64, True, False), bad)]


def test_parameter_sets_expand_every_mark_and_param():
    @pytest.mark.parametrize("a", [1, pytest.param(2, id="two")])
    @pytest.mark.parametrize("b,c", [(3, 4), (5, 6)])
    def fn(a, b, c):
        pass

    def key(d):
        return sorted(d.items())

    got = sorted(parameter_sets(fn), key=key)
    assert got == sorted(({"a": a, "b": b, "c": c} for a in (1, 2) for b, c in ((3, 4), (5, 6))), key=key)
