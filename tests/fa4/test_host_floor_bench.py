"""bench/host_floor.py's interleaved rounds (--ab), on the CPU machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fa4 import cpu_kernels


@pytest.fixture
def host_floor(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    return cpu_kernels.bench_module(monkeypatch, "host_floor")


def test_rotated_rounds_charge_a_drifting_host_to_every_arm_alike(host_floor):
    """A host that slows by 10 us a loop and an arm B that costs 5 us more: the rounds rotate the
    first arm, so B's per-round ratio to A is above 1 in half the rounds and below in the others,
    and its median is the arms' own difference, not the drift."""
    order, clock = [], [0.0]

    def timer(fn):
        clock[0] += 10.0
        order.append(fn())
        return 100.0 + clock[0] + (5.0 if order[-1] == "b" else 0.0)

    times = host_floor.interleaved({"A": lambda: "a", "B": lambda: "b"}, 4, timer)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert times == {"A": [110.0, 140.0, 150.0, 180.0], "B": [125.0, 135.0, 165.0, 175.0]}
    rows = host_floor.ab_summary(times)
    assert rows[0] == "  A                                          median    145.0  range 110.0-180.0"
    assert rows[1] == "  B                                          median    150.0  range 125.0-175.0"
    # B/A a round: 125/110, 135/140, 165/150, 175/180 = 1.136, 0.964, 1.100, 0.972; median 1.036.
    assert rows[2] == "  B / A: median 1.036, range 0.964-1.136 over 4 rounds"


def test_three_arms_rotate_through_every_first_place(host_floor):
    firsts = []

    def timer(fn):
        firsts.append(fn())
        return 1.0

    host_floor.interleaved({"x": lambda: "x", "y": lambda: "y", "z": lambda: "z"}, 3, timer)
    assert firsts == ["x", "y", "z", "y", "z", "x", "z", "x", "y"]


def test_arms_are_picked_by_unique_prefix_in_the_asked_order(host_floor):
    loops = {"floor (no-op)": 1, "floor+3 (3 kernels)": 2, "ours fwd, no grad": 3, "ours fwd+bwd (grad)": 4,
             "ours bwd alone, second thread": ("thread", 5), "sdpa cudnn fwd+bwd": 6}
    assert host_floor.pick(loops, "sdpa cudnn, floor+3,ours fwd+bwd") == {
        "sdpa cudnn fwd+bwd": 6, "floor+3 (3 kernels)": 2, "ours fwd+bwd (grad)": 4}
    with pytest.raises(SystemExit, match="'floor' names 2 rows"):
        host_floor.pick(loops, "floor")
    with pytest.raises(SystemExit, match="'fa2' names 0 rows"):
        host_floor.pick(loops, "fa2")
    with pytest.raises(SystemExit, match="its own thread"):
        host_floor.pick(loops, "ours bwd alone")
