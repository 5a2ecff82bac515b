"""Causal / sequence-length masking of an S = QK^T tile held in WGMMA registers.

Causal masking is aligned bottom-right: query row i may see key columns
j <= i + (seqlen_k - seqlen_q), the convention of FlashAttention 2+ for
seqlen_q != seqlen_k. Masked scores become -inf so exp2 makes them exactly 0.

Coordinates: a thread's elements sit at fixed offsets from its first element, the
same offsets for every thread (the WGMMA accumulator layout is affine in the thread
index). Those offsets are taken from thread 0's partition, where they are
compile-time constants, so the mask costs one compare against an immediate per
element and holds no per-element coordinate registers (which, hoisted out of the
KV loop, would crowd out the WGMMA accumulators).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32


@cute.jit
def apply_mask(
    s_mn: cute.Tensor,  # ((2, MMA_M), (2, V, MMA_N)) fp32 scores of one 64 x tile_n tile, row/col view
    c0_mn: cute.Tensor,  # same view of thread 0's (row, col) coordinates: static offsets
    row_base: Int32,  # global query row of this thread's first element
    col_base: Int32,  # global key column of this thread's first element
    seqlen_q: Int32,
    seqlen_k: Int32,
    causal: cutlass.Constexpr,
):
    nrow = cute.size(s_mn, mode=[0])
    ncol = cute.size(s_mn, mode=[1])
    seq_limit = seqlen_k - col_base
    for r in cutlass.range_constexpr(nrow):
        limit = seq_limit
        if cutlass.const_expr(causal):
            row = row_base + c0_mn[r, 0][0]
            limit = cutlass.min(seq_limit, row + 1 + seqlen_k - seqlen_q - col_base)
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
