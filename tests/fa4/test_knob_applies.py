"""Knobs narrowed to the problems they mean something for (``knob(..., applies=...)``).

iter_configs(cls, problem) enumerates such a knob at its default alone where it does not apply;
that is exact only if the kernel's violations() refuses every other value there. Checked here
for each such knob: on samples of the whole space (the forward's is 1.8M configs), and on the
whole backward space of one problem against the unfiltered enumeration.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from fa4.arch import SM90
from fa4.knobs import iter_configs, knob_specs, problem_choices, space_size
from fa4.problem import Problem
from fa4.sm90 import bwd_config, fwd_config

FWD_PLAIN = Problem.standard(4096, 128, causal=True)
FWD_SOFTCAP = dataclasses.replace(FWD_PLAIN, softcap=30.0)
BWD_MHA = Problem.standard(4096, 128, causal=True, pass_="bwd")
BWD_GQA = Problem(batch=1, seqlen_q=4096, seqlen_k=4096, heads_q=32, heads_kv=8, head_dim=128, head_dim_v=128,
                  causal=True, pass_="bwd")
KERNELS = [(fwd_config.FwdConfigSm90, fwd_config.violations, FWD_PLAIN, FWD_SOFTCAP),
           (bwd_config.BwdConfigSm90, bwd_config.violations, BWD_MHA, BWD_GQA)]


def _random_configs(cls, n: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    specs = knob_specs(cls)
    return [cls(**{s.name: rng.choice(s.choices) for s in specs}) for _ in range(n)]


@pytest.mark.parametrize("cls,violations,without,with_", KERNELS, ids=["fwd", "bwd"])
def test_a_knob_that_does_not_apply_is_feasible_only_at_its_default(cls, violations, without, with_):
    narrowed = [s for s in knob_specs(cls) if s.applies is not None]
    assert narrowed, f"{cls.__name__} declares no narrowed knob"
    for spec in narrowed:
        assert not spec.applies(without) and spec.applies(with_), spec.name
        assert problem_choices(spec, without) == (spec.default,) and problem_choices(spec, with_) == spec.choices
        for c in _random_configs(cls, 3000):
            for value in spec.choices:
                if value != spec.default:
                    assert violations(dataclasses.replace(c, **{spec.name: value}), without, SM90), (spec.name, c)
    # Where it applies, the other values are feasible somewhere (the knob is a real choice there).
    for spec in narrowed:
        others = {v for c in _random_configs(cls, 3000, seed=1) for v in spec.choices
                  if v != spec.default and not violations(dataclasses.replace(c, **{spec.name: v}), with_, SM90)}
        assert others, spec.name


def test_the_narrowed_enumeration_keeps_every_feasible_config_in_order():
    """The whole backward space (221,184 configs) of an MHA problem, filtered with and without the
    problem: the same feasible configs in the same order, from half the enumeration."""
    full = [c for c in iter_configs(bwd_config.BwdConfigSm90) if not bwd_config.violations(c, BWD_MHA, SM90)]
    narrowed = list(iter_configs(bwd_config.BwdConfigSm90, BWD_MHA))
    assert len(narrowed) == space_size(bwd_config.BwdConfigSm90) // 2
    assert [c for c in narrowed if not bwd_config.violations(c, BWD_MHA, SM90)] == full and full


def test_the_forward_space_without_softcap_is_a_fifth():
    spec = next(s for s in knob_specs(fwd_config.FwdConfigSm90) if s.name == "tanh_fma_frac")
    n = sum(1 for _ in iter_configs(fwd_config.FwdConfigSm90, FWD_PLAIN))
    assert n == space_size(fwd_config.FwdConfigSm90) // len(spec.choices)
    assert sum(1 for _ in iter_configs(fwd_config.FwdConfigSm90, FWD_SOFTCAP)) == space_size(fwd_config.FwdConfigSm90)
