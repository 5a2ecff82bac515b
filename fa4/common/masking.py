"""Causal / sliding-window / sequence-length masking of an S = QK^T tile held in WGMMA registers,
and the KV (or Q) tile ranges those masks leave, shared by the forward and the backward.

Alignment is bottom-right (FlashAttention 2+, the reference FA4): with o = seqlen_k - seqlen_q,
query row i sees key j iff j <= i + o + right and j >= i + o - left, where causal means
right = 0 and each window side bounds only when it is on (has_window_left/right). Masked scores
become -inf so exp2 makes them exactly 0.

Coordinates: a thread's elements sit at fixed offsets from its first element, the
same offsets for every thread (the WGMMA accumulator layout is affine in the thread
index). Those offsets are taken from thread 0's partition, where they are
compile-time constants, so each bound costs one compare against an immediate per
element and holds no per-element coordinate registers (which, hoisted out of the
KV loop, would crowd out the WGMMA accumulators).

The range helpers are plain functions over ints: called while a kernel is traced they take
DSL Int32 values (and emit cutlass.min/max), called from Python (tests, host code) plain
ints. Every division has a non-negative dividend, so floor and truncation agree.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32


def _min(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return cutlass.min(a, b)


def _max(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return cutlass.max(a, b)


def _right_offset(causal, has_window_right, window_right):
    """Keys right of the diagonal a row sees, or None when unbounded (causal means 0)."""
    if causal and has_window_right:
        return _min(window_right, 0)
    if causal:
        return 0
    if has_window_right:
        return window_right
    return None


def kv_block_range(m_block, tile_m, tile_n, seqlen_q, seqlen_k, causal, has_window_left, has_window_right,
                   window_left, window_right):
    """(n_block_min, n_block_max): the KV tiles any row of query tile ``m_block`` sees, half-open.

    Empty (n_block_min >= n_block_max) when no row of the tile sees a key; the forward still
    runs one fully masked tile then, so that such rows come out as O = 0 and LSE = -inf.
    """
    o = seqlen_k - seqlen_q
    n_max = (seqlen_k + tile_n - 1) // tile_n
    right = _right_offset(causal, has_window_right, window_right)
    if right is not None:
        # Exclusive bound on the keys the tile's last row sees.
        hi = (m_block + 1) * tile_m + o + right
        n_max = _min(n_max, (_max(hi, 0) + tile_n - 1) // tile_n)
    n_min = 0
    if has_window_left:
        n_min = _max(m_block * tile_m + o - window_left, 0) // tile_n
    return n_min, n_max


def q_block_range(n_block, tile_m, tile_n, seqlen_q, seqlen_k, causal, has_window_left, has_window_right,
                  window_left, window_right):
    """(m_block_min, m_block_max): the query tiles with a row that sees a key of KV tile ``n_block``,
    half-open; empty (m_block_min >= m_block_max) when none does. A tile's rows past seqlen_q count
    (the kernels compute them and drop them at the store)."""
    o = seqlen_k - seqlen_q
    m_max = (seqlen_q + tile_m - 1) // tile_m
    m_min = 0
    right = _right_offset(causal, has_window_right, window_right)
    if right is not None:
        # Row i sees key j only if i >= j - o - right: the tile's first key bounds the first row.
        m_min = _max(n_block * tile_n - o - right, 0) // tile_m
    if has_window_left:
        # ... and only if i <= j - o + left: rows 0 .. last of them, for the tile's last real key.
        last = _min((n_block + 1) * tile_n, seqlen_k) - 1 - o + window_left
        m_max = _min(m_max, (_max(last + 1, 0) + tile_m - 1) // tile_m)
    return m_min, m_max


def kv_mask_split(m_block, tile_m, tile_n, seqlen_q, seqlen_k, causal, has_window_left, has_window_right,
                  window_left, window_right):
    """How the forward walks its KV tiles, from the highest down.

    Returns (n_block_min, n_block_max, n_masked_right, n_unmasked): after the first tile
    (n_block_max - 1, always masked), n_masked_right tiles need the mask (the causal or window
    diagonal, the seqlen_k residue), then n_unmasked need none, then the rest down to
    n_block_min need it again (the left window edge). At least one tile is walked.
    """
    n_min, n_max = kv_block_range(m_block, tile_m, tile_n, seqlen_q, seqlen_k, causal, has_window_left,
                                  has_window_right, window_left, window_right)
    n_max = _max(n_max, 1)
    n_min = _min(n_min, n_max - 1)
    o = seqlen_k - seqlen_q
    # Tiles below unm_hi are unmasked on the right for every row of the tile (its first row's bound).
    unm_hi = seqlen_k // tile_n
    right = _right_offset(causal, has_window_right, window_right)
    if right is not None:
        unm_hi = _min(unm_hi, _max(m_block * tile_m + o + right + 1, 0) // tile_n)
    # Tiles from unm_lo up are unmasked on the left for every row (its last row's bound).
    unm_lo = n_min
    if has_window_left:
        unm_lo = _max(unm_lo, (_max((m_block + 1) * tile_m - 1 + o - window_left, 0) + tile_n - 1) // tile_n)
    total = n_max - 1 - n_min
    unm_hi = _min(unm_hi, n_max - 1)
    masked_right = _min(_max(n_max - 1 - unm_hi, 0), total)
    unmasked = _min(_max(unm_hi - unm_lo, 0), total - masked_right)
    return n_min, n_max, masked_right, unmasked


@cute.jit
def apply_mask(
    s_mn: cute.Tensor,  # ((2, MMA_M), (2, V, MMA_N)) fp32 scores of one 64 x tile_n tile, row/col view
    c0_mn: cute.Tensor,  # same view of thread 0's (row, col) coordinates: static offsets
    row_base: Int32,  # global query row of this thread's first element
    col_base: Int32,  # global key column of this thread's first element
    seqlen_q: Int32,
    seqlen_k: Int32,
    causal: cutlass.Constexpr,
    has_window_left: cutlass.Constexpr = False,
    has_window_right: cutlass.Constexpr = False,
    window_left: Int32 = 0,
    window_right: Int32 = 0,
):
    nrow = cute.size(s_mn, mode=[0])
    ncol = cute.size(s_mn, mode=[1])
    seq_limit = seqlen_k - col_base
    shift = seqlen_k - seqlen_q - col_base
    for r in cutlass.range_constexpr(nrow):
        limit = seq_limit
        row = row_base + c0_mn[r, 0][0]
        if cutlass.const_expr(causal or has_window_right):
            right = _right_offset(causal, has_window_right, window_right)
            limit = cutlass.min(seq_limit, row + 1 + shift + right)
        if cutlass.const_expr(has_window_left):
            lo = row + shift - window_left
            for c in cutlass.range_constexpr(ncol):
                col = c0_mn[r, c][1]
                if (col >= limit) | (col < lo):
                    s_mn[r, c] = -Float32.inf
        else:
            for c in cutlass.range_constexpr(ncol):
                if c0_mn[r, c][1] >= limit:
                    s_mn[r, c] = -Float32.inf


@cute.jit
def apply_key_limits(
    s_mn: cute.Tensor,  # ((2, MMA_M), (2, V, MMA_N)) fp32 scores, row/col view
    c0_mn: cute.Tensor,  # same view of thread 0's (row, col) coordinates: static offsets
    key_limit: cute.Tensor,  # (rows,) Int32: keys [0, limit) visible to each of the thread's rows
    col_base: Int32,  # global key column of this thread's first element
):
    """Mask by a per-row key count, for rows whose query position is not affine in the row index
    (the decode kernel's packed (head, token) rows)."""
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        limit = key_limit[r] - col_base
        for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
            if c0_mn[r, c][1] >= limit:
                s_mn[r, c] = -Float32.inf
