"""A nearest shape's config carried to a shape with no measurement (store.best.carry_config).

Session 43 on the H100: the DB held our Llama-3-8B 8k/8k backward row and none for Sq 128 / Sk 8k.
The nearest-shape rule served the 8k/8k config (GQA reduce 'atomic') and our Sq 128 backward took
2.22 ms fwd+bwd, against 0.96 ms with its own heuristic (GQA reduce 'loop'; session 44, RESULTS).
The rule now keeps the asking shape's heuristic on every knob where the two shapes' heuristics
differ, and carries only what the tuner changed. These tests use the real backward rules.
"""

from __future__ import annotations

import dataclasses

from fa4.arch import SM90
from fa4.knobs import config_to_dict
from fa4.problem import Problem
from fa4.rules import Fa4Rules
from store.best import best_config, carry_config, neighbour_configs

H100 = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "sm_count": 132, "l2_bytes": 50 * 2**20,
        "memory_bytes": 85_520_809_984}
SRC = "src-1"
RULES = Fa4Rules()
LLAMA3_8B = Problem(batch=1, seqlen_q=8192, seqlen_k=8192, heads_q=32, heads_kv=8, head_dim=128, head_dim_v=128,
                    causal=True, pass_="bwd")
SQ128 = dataclasses.replace(LLAMA3_8B, batch=8, seqlen_q=128)


def _store_row(store, problem, config, tflops=570.0):
    dev = store.upsert_device(H100)
    pid = store.upsert_problem(problem)
    cid = store.upsert_config("fa4", config_to_dict(config), type(config))
    return store.add_measurement(dev, pid, cid, status="ok", samples_ms=[1.0], median_ms=1.0, tflops=tflops,
                                 source_fingerprint=SRC)


def _differing_knobs(a, b) -> dict:
    return {f.name: (getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
            if getattr(a, f.name) != getattr(b, f.name)}


def test_the_two_shapes_heuristics_differ_where_it_matters():
    """The premise: the heuristic picks another GQA reduce at Sq 128 than at 8k/8k."""
    diff = _differing_knobs(RULES.default_config(SQ128, SM90), RULES.default_config(LLAMA3_8B, SM90))
    assert diff["gqa_reduce"] == ("loop", "atomic")


def test_a_far_neighbours_default_is_served_as_this_shapes_heuristic(store):
    """The session-43 DB: only the 8k/8k default was measured. Sq 128 is served its own heuristic
    config in full (nothing was tuned to carry), provenance nearest, the notes naming the knobs."""
    theirs = RULES.default_config(LLAMA3_8B, SM90)
    mine = RULES.default_config(SQ128, SM90)
    mid = _store_row(store, LLAMA3_8B, theirs)
    b = best_config(store, RULES, H100["name"], SQ128, running_fp=SRC)
    assert b["provenance"] == "nearest" and b["measurement_id"] == mid
    assert b["config"] == config_to_dict(mine)
    assert b["config"]["gqa_reduce"] == "loop"
    carried = [n for n in b["notes"] if "carried with this shape's heuristic" in n]
    assert len(carried) == 1
    for name, (m, t) in _differing_knobs(mine, theirs).items():
        assert f"{name}={m!r} (measured shape: {t!r})" in carried[0]


def test_the_tuned_delta_travels_and_the_shape_dependent_choice_does_not(store):
    """The 8k/8k row was tuned: exp_pin and ds_early on (both shapes' heuristics have them off),
    one dS stage instead of two. Sq 128 gets those three changes on top of its own heuristic."""
    theirs = RULES.default_config(LLAMA3_8B, SM90)
    assert theirs.ds_stages == 2 and not theirs.exp_pin and not theirs.ds_early
    tuned = dataclasses.replace(theirs, exp_pin=True, ds_early=True, ds_stages=1)
    assert RULES.violations(tuned, LLAMA3_8B, SM90) == []
    _store_row(store, LLAMA3_8B, theirs, tflops=560.0)
    _store_row(store, LLAMA3_8B, tuned, tflops=590.0)
    mine = RULES.default_config(SQ128, SM90)
    assert mine.ds_stages == 2 and not mine.exp_pin and not mine.ds_early
    want = dataclasses.replace(mine, exp_pin=True, ds_early=True, ds_stages=1)
    assert RULES.violations(want, SQ128, SM90) == []
    b = best_config(store, RULES, H100["name"], SQ128, running_fp=SRC)
    assert b["provenance"] == "nearest" and b["tflops"] == 590.0
    assert b["config"] == config_to_dict(want)
    # A tuner's warm start carries the same way: the neighbour's tuned config, on this shape's heuristic.
    warm = neighbour_configs(store, RULES, H100["name"], SQ128, running_fp=SRC)
    assert [w["config"] for w in warm] == [config_to_dict(want)]
    assert warm[0]["from"] == LLAMA3_8B.key()


def test_the_exact_shape_and_shapes_alike_are_served_unchanged(store):
    """Carrying is the identity where the heuristics agree: the exact shape, and a shape the heuristic
    treats alike (Llama-3-8B at 16k and 8k: same defaults here)."""
    theirs = RULES.default_config(LLAMA3_8B, SM90)
    tuned = dataclasses.replace(theirs, exp_pin=True)
    assert carry_config(RULES, LLAMA3_8B, LLAMA3_8B, SM90, tuned) == (tuned, [])
    at16k = dataclasses.replace(LLAMA3_8B, seqlen_q=16384, seqlen_k=16384)
    assert RULES.default_config(at16k, SM90) == theirs
    assert carry_config(RULES, at16k, LLAMA3_8B, SM90, tuned) == (tuned, [])
    _store_row(store, LLAMA3_8B, tuned)
    b = best_config(store, RULES, H100["name"], at16k, running_fp=SRC)
    assert b["provenance"] == "nearest" and b["config"] == config_to_dict(tuned)
    assert not any("carried" in n for n in b["notes"])


class _NoHeuristic:
    """A provider whose heuristic cannot answer for one of the shapes (e.g. no kernel there)."""

    name = "fa4"

    def default_config(self, problem, arch):
        if problem.seqlen_q == 128:
            raise NotImplementedError("no kernel")
        return RULES.default_config(problem, arch)


def test_without_a_heuristic_to_compare_the_measured_config_is_kept():
    tuned = dataclasses.replace(RULES.default_config(LLAMA3_8B, SM90), exp_pin=True)
    assert carry_config(_NoHeuristic(), SQ128, LLAMA3_8B, SM90, tuned) == (tuned, [])
