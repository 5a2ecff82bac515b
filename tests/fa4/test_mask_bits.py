"""The mask_bits knob (fa4.common.masking): a row's verdicts as 32-bit words must be exactly the
per-element compares they replace, for every bound; and the kernels built with it must trade
their per-element ISETPs for R2Ps without spilling.

The arithmetic runs on the host with Python ints through the same functions the kernels trace
with Int32 values (pair_count, query_row_run, key_row_run, keep_word); the host words model
PTX's shifts, which clamp the count at 32."""

from __future__ import annotations

import dataclasses
import random

import pytest

from fa4.common.masking import BITS_PER_WORD, key_row_run, keep_word, pair_count, pair_layout, query_row_run
from fa4.problem import Problem

# Elements a thread holds in a row: tile_n / 4 in the forward (tile_n 64 .. 224), tile_m / 8 .. in
# the backward's S^T (8 .. 32), and 64 (tile_n 256) for the word boundary.
NCOLS = (8, 16, 20, 24, 28, 32, 36, 40, 44, 48, 56, 64)


def offsets(ncol: int) -> list[int]:
    return [8 * (c // 2) + c % 2 for c in range(ncol)]


def kept_by_words(lo, hi, ncol: int) -> list[bool]:
    words = [keep_word(lo, hi, w) for w in range((ncol + BITS_PER_WORD - 1) // BITS_PER_WORD)]
    assert all(0 <= w <= 0xFFFFFFFF for w in words)
    return [bool(words[c // BITS_PER_WORD] >> (c % BITS_PER_WORD) & 1) for c in range(ncol)]


def test_pair_count_counts_the_offsets_below_a_bound():
    for ncol in NCOLS:
        offs = offsets(ncol)
        assert pair_layout(offs) and not pair_layout([0, 1, 2, 3])
        for limit in range(-20, 8 * ncol + 20):
            below = sum(o < limit for o in offs)
            assert min(pair_count(limit), ncol) == below, (ncol, limit)
            # The offsets below a bound are a prefix, so a count is the whole verdict.
            assert [o < limit for o in offs] == [c < below for c in range(ncol)]


def test_words_keep_exactly_the_run():
    for ncol in NCOLS:
        for lo in [None, *range(-3, ncol + 40, 3)]:
            for hi in range(-3, ncol + 40, 5):
                want = [(lo is None or c >= lo) and c < hi for c in range(ncol)]
                assert kept_by_words(lo, hi, ncol) == want, (ncol, lo, hi)


@pytest.mark.parametrize("causal,left,right", [(True, False, False), (False, True, True), (True, True, False),
                                               (False, False, True), (False, True, False)])
def test_forward_rows_match_the_compares(causal, left, right):
    """apply_mask's per-element rule against query_row_run + the words, on random bounds."""
    rng = random.Random(7)
    for _ in range(3000):
        ncol = rng.choice(NCOLS)
        seqlen_q, seqlen_k = rng.randint(1, 600), rng.randint(1, 600)
        col_base = rng.randrange(0, 640, 8) + rng.choice((0, 2, 4, 6))
        row = rng.randint(0, 640)
        wl, wr = rng.randint(0, 300), rng.randint(0, 300)
        seq_limit, shift = seqlen_k - col_base, seqlen_k - seqlen_q - col_base
        limit = seq_limit
        r = 0 if causal and not right else (min(wr, 0) if causal else wr) if (causal or right) else None
        if causal and right:
            r = min(wr, 0)
        if r is not None:
            limit = min(seq_limit, row + 1 + shift + r)
        want = [o < limit and (not left or o >= row + shift - wl) for o in offsets(ncol)]
        lo, hi = query_row_run(row, seq_limit, shift, causal, left, right, wl, wr)
        assert kept_by_words(lo, hi, ncol) == want, (ncol, row, seqlen_q, seqlen_k, col_base, wl, wr)


@pytest.mark.parametrize("diag,left", [(True, False), (True, True), (False, True)])
def test_backward_key_rows_match_the_compares(diag, left):
    """apply_mask_t's per-element rule (rows are keys, columns queries) against key_row_run."""
    rng = random.Random(11)
    for _ in range(3000):
        ncol = rng.choice(NCOLS)
        key = rng.choice((0, 1, 8, 9, 64, 65, 72, 73, 120, 121))
        key_limit = rng.randint(-130, 300)
        diag_hi, diag_lo = rng.randint(-400, 400), rng.randint(-400, 400)
        q_base = rng.randint(0, 400)
        want = []
        for o in offsets(ncol):
            q = q_base + o
            limit = min(key_limit, q + 1 + diag_hi) if diag else key_limit
            want.append(key < limit and (not left or key >= q + diag_lo))
        lo, hi = key_row_run(key, key_limit, diag_hi, diag_lo, q_base, diag, left, ncol)
        assert kept_by_words(lo, hi, ncol) == want, (ncol, key, key_limit, diag_hi, diag_lo, q_base)


def test_mask_bits_is_feasible_only_where_a_bound_moves_per_row():
    from fa4.sm90.bwd_config import BwdConfigSm90
    from fa4.sm90.bwd_config import violations as bwd_violations
    from fa4.sm90.compile import compile_key
    from fa4.sm90.fwd_config import FwdConfigSm90
    from fa4.sm90.fwd_config import violations as fwd_violations

    for pass_, cls, violations in (("fwd", FwdConfigSm90, fwd_violations), ("bwd", BwdConfigSm90, bwd_violations)):
        on = cls(mask_bits=True)
        full = Problem.standard(4096, 128, pass_=pass_)
        assert any("mask_bits" in v for v in violations(on, full))
        for feat in ({"causal": True}, {"window_left": 128}, {"window_right": 64}):
            assert not [v for v in violations(on, dataclasses.replace(full, **feat)) if "mask_bits" in v], feat
    # Where nothing moves per row the knob names the same kernel as its default.
    assert compile_key("bf16", 128, False, True, FwdConfigSm90(mask_bits=True)) == \
        compile_key("bf16", 128, False, True, FwdConfigSm90())
    assert compile_key("bf16", 128, True, True, FwdConfigSm90(mask_bits=True)) != \
        compile_key("bf16", 128, True, True, FwdConfigSm90())


@pytest.mark.parametrize("pass_,hd,causal,window", [
    ("fwd", 64, True, False), ("fwd", 128, True, False), ("fwd", 128, False, True),
    ("bwd", 64, True, False), ("bwd", 128, True, False), ("bwd", 128, False, True),
])
def test_mask_bits_kernels_take_r2p_for_the_compares(pass_, hd, causal, window):
    """Compiled with and without the knob: the same GEMMs and exponentials, no spills, R2P where
    there was none, and a fraction of the ISETPs (hd128 causal forward 150 -> 26, backward 84 -> 54
    in session 22; the backward keeps its per-row and loop compares)."""
    from fa4.sm90.compile import ensure_target
    from tests.fa4.codegen_asserts import assert_no_spills, compile_and_read

    ensure_target()
    feat = {"has_window_left": True, "has_window_right": True} if window else {}
    prob = Problem.standard(4096, hd, causal=causal, pass_=pass_)
    ops = {}
    for on in (False, True):
        if pass_ == "fwd":
            from fa4.sm90.compile import compile_fwd, compile_key
            from fa4.sm90.fwd_config import default_config

            config = dataclasses.replace(default_config(prob), mask_bits=on)
            build, key = compile_fwd, compile_key("bf16", hd, causal, True, config, hd, **feat)
        else:
            from fa4.sm90.bwd_compile import compile_bwd_main, compile_key
            from fa4.sm90.bwd_defaults import default_config

            # (stat_shuffle, the hd64 default, is built without mask_bits: both off and on compare one layout.)
            config = dataclasses.replace(default_config(prob), mask_bits=on, stat_shuffle=False)
            build, key = compile_bwd_main, compile_key("bf16", hd, causal, False, False, config, hd, **feat)
        ptx, cubin, ops[on] = compile_and_read(build, key, ["ISETP", "R2P", "MUFU.EX2"])
        assert_no_spills(ptx, cubin, ops[on])
    plain, bits = ops[False], ops[True]
    assert bits["HGMMA"] == plain["HGMMA"] and bits["MUFU.EX2"] == plain["MUFU.EX2"], ops
    assert plain["R2P"] == 0 < bits["R2P"], ops
    assert bits["ISETP"] * (4 if pass_ == "fwd" else 1.3) <= plain["ISETP"], ops
