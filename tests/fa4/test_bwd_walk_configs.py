"""The configs the GPU tests of the walk orders run (tests/fa4/test_bwd_walk_down_gpu.py and
test_bwd_q_starts_gpu.py) and of the in-kernel GQA finish (test_bwd_gpu.py's LAST cases), resolved on
the CPU: each must be feasible and must change its knob.

Those tests derive their configs from the problem's default, which moves when a default does
(session 30's q_starts 16 at hd128/256 made every walk_down case with seqlen_q < seqlen_k at those
head dims infeasible, found only on a GPU). Here the same products of the same module constants
resolve through the same helpers (bench/check_bwd.py: with_knob), so CI sees such a change.
Session 37's stat_shuffle default at hd64 did the same to the 8 non-deterministic hd64 last_cta
cases, found on a GPU in session 42.
"""

import itertools

import pytest

from fa4.sm90.bwd_config import violations
from tests.fa4 import cpu_kernels
from tests.fa4 import test_bwd_gpu as main_gpu
from tests.fa4 import test_bwd_q_starts_gpu as qs
from tests.fa4 import test_bwd_walk_down_gpu as wd


def walk_down_cases():
    for hd, shape in itertools.product(wd.HDS, wd.SHAPES):
        yield shape, hd, False, {}
    for (hd, change), shape in itertools.product(wd.DET_CHANGES, wd.DET_SHAPES):
        if change.get("gqa_reduce") == "loop" and shape[3] == shape[4]:
            shape = (shape[0], shape[1], shape[2], shape[3], shape[3] // 2)
        yield shape, hd, True, change
    for (hd, change), shape in itertools.product(wd.CHANGES, wd.BESIDE_SHAPES):
        yield shape, hd, False, change
    for hd in (128, 256):
        yield (1, 777, 1333, 8, 2), hd, False, {}


def q_starts_cases():
    for hd, starts, shape in itertools.product(qs.HDS, (4, 64), qs.SHAPES):
        yield shape, hd, False, starts, {}
    for hd, starts, shape in itertools.product(qs.HDS, (4, 64), qs.LEFT_SHAPES):
        yield shape, hd, True, starts, {}
    for (hd, change), starts, causal in itertools.product(qs.CHANGES, (4, 16), (False, True)):
        yield (1, 1000, 1000 if not causal else 2500, 8, 2), hd, causal, starts, change
    for hd in (128, 256):
        yield (1, 777, 1333, 8, 2), hd, False, 16, {}


def test_every_walk_down_case_walks_down_feasibly():
    check_bwd = cpu_kernels.check_bwd()
    cases = list(walk_down_cases())
    for shape, hd, det, change in cases:
        cfg = wd.walking_down(check_bwd, shape, hd, det, **change)
        assert cfg.walk_down and cfg.q_starts == 1
        assert not violations(cfg, check_bwd.problem_for(shape, hd, True, det))
        for knob, value in change.items():
            assert getattr(cfg, knob) == value, (shape, hd, knob)
    assert len(cases) == 6 * 5 + 9 * 3 + 5 * 2 + 2


def test_every_q_starts_case_shifts_feasibly():
    check_bwd = cpu_kernels.check_bwd()
    cases = list(q_starts_cases())
    for shape, hd, causal, starts, change in cases:
        cfg = check_bwd.with_knob(shape, hd, causal, False, "q_starts", starts, **change)
        assert cfg.q_starts == starts
        assert not violations(cfg, check_bwd.problem_for(shape, hd, causal, False))
    assert len(cases) == 6 * 2 * 5 + 6 * 2 * 3 + 6 * 2 * 2 + 2


@pytest.mark.parametrize("knob,value,causal", [("q_starts", 4, True), ("walk_down", True, False)])
def test_with_knob_refuses_a_case_that_would_not_run_the_knob(knob, value, causal):
    """q_starts under a causal bound at Sq = Sk (the bound spreads the runs already) and walk_down
    without a bound are infeasible: the helper says so rather than test the default."""
    with pytest.raises(ValueError, match="infeasible"):
        cpu_kernels.check_bwd().with_knob((1, 1000, 1000, 4, 4), 128, causal, False, knob, value)


def test_every_last_cta_case_finishes_in_the_kernel_feasibly():
    """test_bwd_gpu's gqa_finish 'last_cta' cases: non-deterministic over every shape, head dim and
    mask, deterministic over the bitwise test's product."""
    check_bwd = cpu_kernels.check_bwd()
    cases = [(shape, hd, causal, False) for shape, hd, causal in
             itertools.product(main_gpu.LAST_SHAPES, (64, 96, 128, 256), (False, True))]
    cases += [(shape, hd, causal, True) for shape, hd, causal in
              itertools.product(main_gpu.LAST_SHAPES[:3], (64, 128), (False, True))]
    for shape, hd, causal, det in cases:
        cfg = check_bwd.default_for(shape, hd, causal, det, **main_gpu.LAST)
        assert cfg.gqa_finish == "last_cta" and cfg.gqa_reduce == "atomic"
        assert not violations(cfg, check_bwd.problem_for(shape, hd, causal, det)), (shape, hd, causal, det)
    assert len(cases) == 4 * 4 * 2 + 3 * 2 * 2
