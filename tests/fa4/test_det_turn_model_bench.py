"""bench/det_turn_model.py on the CPU: its turn orders, its timing of waits and its deadlock check."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "det_turn_model", Path(__file__).resolve().parents[2] / "bench" / "det_turn_model.py")
M = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(M)


def test_turns_match_the_kernels_dq_turn_for_the_launch_order():
    """'launch' turns are fa4.common.bwd_schedule.dq_turn's (spt 1: shortest first counts down),
    'reversed' the other direction, over every causal (query tile, key tile) pair."""
    from fa4.common.bwd_schedule import dq_turn

    num_n, tile = 6, 128
    for i in range(num_n):
        for n in range(i + 1):
            for spt in (0, 1):
                want = dq_turn(i, n, tile, tile, num_n, num_n * tile, num_n * tile, True, spt)
                assert M.turn(i, n, "launch", longest_first=not spt) == want
                assert M.turn(i, n, "reversed", longest_first=not spt) == i - want
    order = M.launch_order(3, 4, 2, longest_first=True)
    assert order[:4] == [(0, 0), (1, 0), (0, 1), (1, 1)] and order[6:8] == [(2, 0), (3, 0)]
    assert M.launch_order(3, 1, 1, longest_first=False) == [(0, 2), (0, 1), (0, 0)]


def test_shortest_first_walking_up_hides_a_hand_off_under_one_step():
    """The reading the kernels' SPT default rests on: its first turn goes to the CTA that gets
    there first, one step ahead of the next turn: a hand-off under a step costs nothing, a longer one does."""
    for num_n, heads, sms in ((8, 6, 10), (16, 4, 24)):
        free = M.makespan(num_n, heads, 1, False, False, None, 0.0, sms)
        assert M.makespan(num_n, heads, 1, False, False, "launch", 0.0, sms) == pytest.approx(free)
        assert M.makespan(num_n, heads, 1, False, False, "launch", 0.5, sms) == pytest.approx(free)  # under a step: hidden
        assert M.makespan(num_n, heads, 1, False, False, "launch", 1.5, sms) > free
    # Longest first walking up with launch-order turns waits even with a free hand-off.
    assert M.makespan(16, 4, 1, True, False, "launch", 0.0, 24) > M.makespan(16, 4, 1, True, False, None, 0.0, 24)


def test_reversed_turns_deadlock_when_a_group_outgrows_the_machine():
    """Under LPT, reversed turns make a CTA wait for later-launched ones: with fewer SMs than a
    group's CTAs every resident CTA can wait on one that cannot start. Launch-order turns cannot."""
    assert M.makespan(8, 2, 1, True, False, "reversed", 0.1, sms=4) is None
    assert M.makespan(8, 2, 1, True, False, "launch", 0.1, sms=4) is not None
    assert M.makespan(8, 2, 1, True, False, "reversed", 0.1, sms=8) is not None


def test_makespan_is_the_work_on_one_sm_and_bounded_by_it_on_many():
    num_n, heads = 5, 3
    one = M.makespan(num_n, heads, 1, True, False, None, 0.0, sms=1)
    assert one == pytest.approx(M.work(num_n, heads))
    many = M.makespan(num_n, heads, 1, True, False, None, 0.0, sms=4)
    assert M.work(num_n, heads) / 4 <= many < one
