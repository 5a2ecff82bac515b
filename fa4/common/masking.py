"""Causal / sequence-length masking of an S = QK^T tile held in WGMMA registers.

Causal masking is aligned bottom-right: query row i may see key columns
j <= i + (seqlen_k - seqlen_q), the convention of FlashAttention 2+ for
seqlen_q != seqlen_k. Masked scores become -inf so exp2 makes them exactly 0.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32


@cute.jit
def apply_mask(
    acc_s: cute.Tensor,  # (MMA, MMA_M, MMA_N) fp32 scores of one 64 x tile_n tile
    t_coord: cute.Tensor,  # same shape: (row, col) of each score inside the tile
    row_offset: Int32,  # global query row of tile row 0
    col_offset: Int32,  # global key column of tile column 0
    seqlen_q: Int32,
    seqlen_k: Int32,
    causal: cutlass.Constexpr,
):
    # The diagonal offset is a per-problem constant; one IMAD per element then decides.
    causal_shift = seqlen_k - seqlen_q + 1 - col_offset
    seq_limit = seqlen_k - col_offset
    for i in cutlass.range_constexpr(cute.size(acc_s)):
        r, c = t_coord[i]
        limit = seq_limit
        if cutlass.const_expr(causal):
            limit = cutlass.min(seq_limit, row_offset + r + causal_shift)
        if c >= limit:
            acc_s[i] = -Float32.inf
