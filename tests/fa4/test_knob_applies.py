"""Knobs narrowed to the problems they mean something for (``knob(..., applies=...)``), and
knobs without effect in some configs (``knob(..., inert=...)``).

iter_configs(cls, problem) enumerates a knob at its default alone where it does not apply; that
is exact only if the kernel's violations() refuses every other value there. Checked here for
each such knob: on samples of the whole space (the forward's is 1.8M configs), and on the whole
backward space of one problem against the unfiltered enumeration. It also leaves out the configs
in which a knob off its default is inert; their canonical form (the default's kernel) is feasible
and enumerated.
"""

from __future__ import annotations

import dataclasses

import pytest

from fa4.arch import SM90
from fa4.knobs import (
    canonical_config,
    compile_time_config,
    iter_configs,
    knob_specs,
    problem_choices,
    random_configs,
    space_size,
)
from fa4.problem import Problem
from fa4.sm90 import bwd_config, bwd_defaults, fwd_config

FWD_PLAIN = Problem.standard(4096, 128, causal=True)
FWD_SOFTCAP = dataclasses.replace(FWD_PLAIN, softcap=30.0)
BWD_MHA = Problem.standard(4096, 128, causal=True, pass_="bwd")
BWD_GQA = Problem(batch=1, seqlen_q=4096, seqlen_k=4096, heads_q=32, heads_kv=8, head_dim=128, head_dim_v=128,
                  causal=True, pass_="bwd")
BWD_VARLEN = Problem(batch=8, seqlen_q=4096, seqlen_k=4096, heads_q=16, heads_kv=16, head_dim=128, head_dim_v=128,
                     causal=True, pass_="bwd", varlen=True, varlen_mean_q=2048, varlen_mean_k=2048)
# Not causal, no window: no bound moves per row (mask_bits does not apply).
FWD_FULL = Problem.standard(4096, 128)
# ctas_per_sm applies at head_dim 64 only (the fragments fit 104 registers there).
FWD_HD64 = Problem.standard(512, 64, causal=True)
BWD_FULL = Problem.standard(4096, 128, pass_="bwd")
# dp_first and dk_before_dq order the GEMMs of dkv_split 'head_dim': head_dim 192/256.
BWD_HD256 = Problem.standard(4096, 256, causal=True, pass_="bwd")
# stat_shuffle splits tile_m 128's columns, which fits head_dim 64 only.
BWD_HD64 = Problem.standard(4096, 64, causal=True, pass_="bwd")
# Per kernel: problems to find, for each narrowed knob, one where it does not apply and one where it does.
KERNELS = [(fwd_config.FwdConfigSm90, fwd_config.violations, [FWD_PLAIN, FWD_SOFTCAP, FWD_FULL, FWD_HD64]),
           (bwd_config.BwdConfigSm90, bwd_config.violations, [BWD_MHA, BWD_GQA, BWD_VARLEN, BWD_FULL, BWD_HD256, BWD_HD64])]


@pytest.mark.parametrize("cls,violations,problems", KERNELS, ids=["fwd", "bwd"])
def test_a_knob_that_does_not_apply_is_feasible_only_at_its_default(cls, violations, problems):
    narrowed = [s for s in knob_specs(cls) if s.applies is not None]
    assert narrowed, f"{cls.__name__} declares no narrowed knob"
    pairs = {}
    for spec in narrowed:
        without = next(p for p in problems if not spec.applies(p))
        with_ = pairs[spec.name] = next(p for p in problems if spec.applies(p))
        assert problem_choices(spec, without) == (spec.default,) and problem_choices(spec, with_) == spec.choices
        for c in random_configs(cls, 3000):
            for value in spec.choices:
                if value != spec.default:
                    assert violations(dataclasses.replace(c, **{spec.name: value}), without, SM90), (spec.name, c)
    # Where it applies, the other values are feasible somewhere (the knob is a real choice there).
    # (Rare combinations need more than one sample of 3,000: up to four are drawn.)
    for spec in narrowed:
        with_ = pairs[spec.name]
        others = set()
        for seed in range(1, 5):
            others = {v for c in random_configs(cls, 3000, seed=seed, problem=with_) for v in spec.choices
                      if v != spec.default and not violations(dataclasses.replace(c, **{spec.name: v}), with_, SM90)}
            if others:
                break
        assert others, spec.name


@pytest.mark.timeout(1800)  # the whole declaration walked: past the suite's 600 s on two busy CPUs
def test_the_narrowed_enumeration_keeps_every_feasible_config_in_order():
    """The whole backward space of a dense causal MHA problem (the declaration's 1,811,939,328 configs,
    walked as about 54.9M (50.1M before gqa_add) that the requires() of stat_shuffle, qm_tile_n, do_single,
    gqa_add and walk_down leave),
    filtered with and without the problem: the same feasible configs in the same order, from a 4096th
    of the declaration (stat_shuffle, gqa_reduce, gqa_finish, gqa_add, varlen_grid, dp_first, dk_before_dq,
    qm_tile_n, do_single and q_starts at their defaults)."""
    full = [c for c in iter_configs(bwd_config.BwdConfigSm90) if not bwd_config.violations(c, BWD_MHA, SM90)]
    narrowed = list(iter_configs(bwd_config.BwdConfigSm90, BWD_MHA))
    assert len(narrowed) == space_size(bwd_config.BwdConfigSm90) // 4096
    assert [c for c in narrowed if not bwd_config.violations(c, BWD_MHA, SM90)] == full and full


def test_the_forward_space_without_softcap_is_under_a_fifth():
    specs = {s.name: s for s in knob_specs(fwd_config.FwdConfigSm90)}
    tanh, frac, ctas = specs["tanh_fma_frac"], specs["exp2_emu_frac"], specs["ctas_per_sm"]
    # Of the (fraction, pattern) pairs, the pattern is inert at fraction 0: one pair of two goes.
    kept = (2 * len(frac.choices) - 1) / (2 * len(frac.choices))
    # head_dim 128: one CTA an SM only.
    space = space_size(fwd_config.FwdConfigSm90) // len(ctas.choices)
    n = sum(1 for _ in iter_configs(fwd_config.FwdConfigSm90, FWD_PLAIN))
    assert n == space // len(tanh.choices) * kept
    assert sum(1 for _ in iter_configs(fwd_config.FwdConfigSm90, FWD_SOFTCAP)) == space * kept


def _enumerated(config, problem) -> bool:
    """Whether iter_configs(type(config), problem) yields ``config`` (without walking the space)."""
    specs = knob_specs(type(config))
    return all(getattr(config, s.name) in problem_choices(s, problem) for s in specs) and not any(
        s.inert is not None and getattr(config, s.name) != s.default and s.inert(config) for s in specs)


@pytest.mark.parametrize("problem", [FWD_PLAIN, FWD_SOFTCAP], ids=["plain", "softcap"])
def test_an_inert_knob_leaves_the_default_kernel_which_is_enumerated(problem):
    """A feasible config with the exp2 pattern off its default at fraction 0 runs the default
    pattern's kernel (one compile key), and that config is feasible and enumerated."""
    from fa4.sm90.compile import compile_key

    seen = 0
    for c in random_configs(fwd_config.FwdConfigSm90, 20000, seed=2):
        if fwd_config.violations(c, problem, SM90):
            continue
        canon = canonical_config(c)
        assert not fwd_config.violations(canon, problem, SM90) and _enumerated(canon, problem), c
        assert compile_time_config(c) == compile_time_config(canon)
        key = compile_key("bf16", 128, True, True, c, 128, has_softcap=problem.softcap > 0)
        assert key == compile_key("bf16", 128, True, True, canon, 128, has_softcap=problem.softcap > 0)
        if canon != c:
            seen += 1
            assert c.exp2_emu_frac == 0 and c.exp2_emu_pattern != "block" and not _enumerated(c, problem)
    assert seen > 10


@pytest.mark.parametrize("cls,problem", [(fwd_config.FwdConfigSm90, FWD_PLAIN), (bwd_config.BwdConfigSm90, BWD_HD256)],
                         ids=["fwd", "bwd-hd256"])
def test_holding_the_runtime_knobs_walks_each_kernel_once(cls, problem):
    """iter_configs(..., vary_runtime=False) is the enumeration with every runtime knob at its
    default, in the same order, and every enumerated config's kernel (compile_time_config) is
    among them: the compile-only suites walk kernels with it, not launches."""
    runtime = {s.name: s.default for s in knob_specs(cls) if s.runtime is not None}
    assert runtime
    held = list(iter_configs(cls, problem, vary_runtime=False))
    kernels = set(held)
    n = 0
    for c in iter_configs(cls, problem):
        if all(getattr(c, k) == v for k, v in runtime.items()):
            assert c == held[n]
            n += 1
        assert compile_time_config(c) in kernels
    assert n == len(held)


BWD_HD192 = Problem.standard(4096, 192, causal=True, pass_="bwd")


@pytest.mark.parametrize("problem", [BWD_HD192, BWD_HD256, BWD_HD64], ids=["hd192", "hd256", "hd64"])
def test_a_knob_whose_requirements_fail_is_feasible_only_at_its_default(problem):
    """``requires`` (qm_tile_n needs dkv_split 'head_dim', P^T in shared memory, tile_m 64 and no
    exchange; do_single needs qm_tile_n): where the knobs declared before it do not meet it,
    violations() refuses every other value, so iter_configs may skip them; where they do, the other
    values are feasible somewhere (a real choice)."""
    cls = bwd_config.BwdConfigSm90
    names = [s.name for s in knob_specs(cls)]
    # (Each at the problems it applies to: stat_shuffle at head_dim 64, the others at 192/256.)
    specs = [s for s in knob_specs(cls) if s.requires is not None and (s.applies is None or s.applies(problem))]
    assert {s.name for s in specs} >= ({"stat_shuffle"} if problem.head_dim == 64 else {"qm_tile_n", "do_single"})
    for spec in specs:
        before = names[:names.index(spec.name)]
        feasible_met = 0
        for c in random_configs(cls, 4000, seed=3, problem=problem):
            met = spec.requires({n: getattr(c, n) for n in before})
            for value in spec.choices:
                if value == spec.default:
                    continue
                bad = bwd_config.violations(dataclasses.replace(c, **{spec.name: value}), problem, SM90)
                if not met:
                    assert bad, (spec.name, value, c)
                feasible_met += met and not bad
        # stat_shuffle is feasible only in the default's layout (about one random config in 2,000 meets
        # its requires and the layout): the problem's default config counts as a sample too.
        base = bwd_defaults.default_config(problem)
        if spec.requires({n: getattr(base, n) for n in before}):
            feasible_met += sum(not bwd_config.violations(dataclasses.replace(base, **{spec.name: v}), problem, SM90)
                                for v in spec.choices if v != spec.default)
        assert feasible_met, spec.name


def test_requires_prunes_the_product_in_its_order():
    """iter_configs with a knob's requires: the declaration's product, in its order, less the configs
    whose knob is off its default where the knobs before it do not meet the requirement."""
    import itertools
    from dataclasses import dataclass

    from fa4.knobs import knob

    @dataclass(frozen=True)
    class Toy:
        a: int = knob((0, 1, 2), 0, "a")
        b: str = knob(("x", "y"), "x", "b", requires=lambda k: k["a"] > 0)
        c: bool = knob((False, True), False, "c")
        d: int = knob((0, 4), 0, "d", requires=lambda k: k["b"] == "y" and not k["c"])
        e: int = knob((1, 2), 1, "e", runtime=True)

    want = [Toy(a, b, c, d, e) for a, b, c, d, e in itertools.product((0, 1, 2), ("x", "y"), (False, True), (0, 4), (1, 2))
            if (b == "x" or a > 0) and (d == 0 or (b == "y" and not c))]
    assert list(iter_configs(Toy)) == want and len(want) == 24
    assert list(iter_configs(Toy, vary_runtime=False)) == [t for t in want if t.e == 1]
