"""The reference FA4's knob declaration, derived search space and feasibility rules."""

import dataclasses
import math

import optuna
import pytest

from fa4.arch import SM90, SM100
from fa4.knobs import config_from_dict, iter_configs, json_schema, knob_specs, search_space, space_size
from fa4.problem import Problem
from providers import get_provider
from providers.flash_attn4 import (
    RefFa4FwdKnobs,
    fwd_default,
    fwd_register_use,
    fwd_smem_bytes,
    fwd_violations,
)
from tuner.study import suggest_config

HD128 = Problem.standard(8192, 128)
HD64 = Problem.standard(8192, 64)


def test_declaration_drives_space_and_schema():
    fields = [f.name for f in dataclasses.fields(RefFa4FwdKnobs)]
    specs = knob_specs(RefFa4FwdKnobs)
    assert [s.name for s in specs] == fields
    space = search_space(RefFa4FwdKnobs)
    assert list(space) == fields
    assert space_size(RefFa4FwdKnobs) == math.prod(len(c) for c in space.values())
    assert len(list(iter_configs(RefFa4FwdKnobs))) == space_size(RefFa4FwdKnobs)
    schema = json_schema(RefFa4FwdKnobs)
    assert schema["properties"]["tile_n"]["enum"] == list(space["tile_n"])
    assert schema["properties"]["mma_pv_is_rs"]["type"] == "boolean"
    # Every field carries a doc string for the REST schema and dashboards.
    assert all(s.doc for s in specs)


def test_optuna_space_is_one_categorical_per_knob():
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
    trial = study.ask()
    cfg = suggest_config(trial, RefFa4FwdKnobs)
    assert isinstance(cfg, RefFa4FwdKnobs)
    assert set(trial.distributions) == set(search_space(RefFa4FwdKnobs))
    for name, dist in trial.distributions.items():
        assert isinstance(dist, optuna.distributions.CategoricalDistribution)
        assert tuple(dist.choices) == search_space(RefFa4FwdKnobs)[name]
    # FixedTrial replays a dict through the same code path.
    fixed = {"tile_m": 192, "tile_n": 96, "mma_pv_is_rs": False, "intra_wg_overlap": True}
    assert suggest_config(optuna.trial.FixedTrial(fixed), RefFa4FwdKnobs) == RefFa4FwdKnobs(**fixed)


def test_bwd_has_no_knobs_the_problem_decides_determinism():
    """The backward's one switch, deterministic, restates the problem: not a knob."""
    p = get_provider("flash-attn-4")
    bwd = Problem.standard(8192, 128, pass_="bwd")
    det = Problem.standard(8192, 128, pass_="bwd", deterministic=True)
    assert p.knob_cls_for(bwd) is None and p.knob_cls_for(det) is None
    assert p.knob_cls_for(HD128) is RefFa4FwdKnobs
    assert p.default_config(det, SM90) is None and p.default_config(bwd, SM90) is None
    assert p.violations(None, det, SM90) == [] and p.violations(None, bwd, SM90) == []


@pytest.mark.parametrize("hd", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_defaults_are_feasible(hd, causal):
    p = Problem.standard(8192, hd, causal=causal)
    assert fwd_violations(fwd_default(p), p, SM90) == []


# Configs the reference ran on our H200 (design/anchors.md: its sweep winners and defaults):
# our rules must not reject what demonstrably works.
@pytest.mark.parametrize(
    "hd,cfg",
    [
        (64, RefFa4FwdKnobs(192, 128, True, True)),
        (128, RefFa4FwdKnobs(128, 160, True, True)),
        (128, RefFa4FwdKnobs(128, 176, True, True)),
        (128, RefFa4FwdKnobs(128, 128, True, True)),
    ],
)
def test_configs_measured_on_h200_are_feasible(hd, cfg):
    p = Problem.standard(8192, hd)
    assert fwd_violations(cfg, p, SM90) == []


def test_register_budget_rejects_with_reason():
    cfg = RefFa4FwdKnobs(192, 144, True, True)
    used, budget = fwd_register_use(cfg, HD128)
    # 3 MMA warpgroups: per thread S = 144/2, O = 128/2, P = 144/4 registers.
    assert used == 72 + 64 + 36
    assert used > budget
    (reason,) = fwd_violations(cfg, HD128, SM90)
    assert reason.startswith("registers:")
    assert "3 MMA warpgroup" in reason
    # Staging P through shared memory frees P's registers: S + O = 136 still exceeds 128.
    assert fwd_register_use(RefFa4FwdKnobs(192, 144, False, True), HD128)[0] == 72 + 64


def test_smem_budget_rejects_with_reason():
    cfg = RefFa4FwdKnobs(128, 192, False, False)
    smem = fwd_smem_bytes(cfg, HD128)
    # Q/O 32 KiB + K 2x48 KiB + V 2x48 KiB + P 48 KiB + barriers.
    assert smem == (32 + 96 + 96 + 48 + 1) * 1024
    v = fwd_violations(cfg, HD128, SM90)
    assert len(v) == 1 and v[0].startswith("shared memory:") and "exceeds" in v[0]
    # The same tile with P in registers fits.
    assert fwd_violations(RefFa4FwdKnobs(128, 192, True, False), HD128, SM90) == []


def test_shape_and_arch_rules():
    assert fwd_violations(RefFa4FwdKnobs(128, 128, True, True), HD128, SM100) == [
        "these knobs drive the reference's sm90 kernel, not sm100"
    ]
    odd = RefFa4FwdKnobs(128, 72, True, True)  # off the menu, as a hand-written config could be
    assert any("multiple of 16" in r for r in fwd_violations(odd, HD128, SM90))
    bad = Problem.standard(1024, 100)
    assert get_provider("flash-attn-4").problem_errors(bad) == [
        "head_dim=100: the reference FA4 on sm90 needs a multiple of 8 in [8, 256]"
    ]


def test_feasible_counts_follow_head_dim():
    p = get_provider("flash-attn-4")
    n64 = len(p.feasible_configs(HD64, SM90))
    n128 = len(p.feasible_configs(HD128, SM90))
    n256 = len(p.feasible_configs(Problem.standard(8192, 256), SM90))
    assert n64 > n128 > n256 > 0
    # Each rejected config of the menu says why, and the reason is the budget it exceeds.
    from providers.flash_attn4 import fwd_register_use, fwd_smem_bytes

    for c in iter_configs(RefFa4FwdKnobs):
        v = fwd_violations(c, HD128, SM90)
        used, budget = fwd_register_use(c, HD128)
        want = (["registers"] if used > budget else []) + (
            ["shared memory"] if fwd_smem_bytes(c, HD128) > SM90.smem_per_cta else [])
        assert [r.split(":")[0] for r in v] == want, (c, v)


def test_config_round_trip_and_validation():
    p = get_provider("flash-attn-4")
    d = {"tile_m": 128, "tile_n": 176, "mma_pv_is_rs": True, "intra_wg_overlap": False}
    assert p.config_to_dict(p.config_from_dict(HD128, d)) == d
    with pytest.raises(ValueError, match="tile_n"):
        config_from_dict(RefFa4FwdKnobs, {"tile_n": 100})


@pytest.mark.ref
@pytest.mark.parametrize("hd,hdv", [(64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256)])
@pytest.mark.parametrize("causal", [False, True])
def test_default_matches_reference_heuristic(hd, hdv, causal):
    from flash_attn.cute.interface import _tile_size_fwd_sm90

    theirs = _tile_size_fwd_sm90(hd, hdv, causal, False)
    ours = fwd_default(Problem.standard(4096, hd, head_dim_v=hdv, causal=causal))
    assert (ours.tile_m, ours.tile_n, ours.mma_pv_is_rs, ours.intra_wg_overlap) == (
        theirs.m_block_size, theirs.n_block_size, theirs.mma_pv_is_rs, theirs.intra_wg_overlap)
