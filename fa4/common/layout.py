"""Views of WGMMA register fragments shared by the kernels.

A WGMMA accumulator fragment of a 64xN tile has, per thread, the layout
((2, 2, N/8), MMA_M, MMA_N): two adjacent columns, two rows eight apart, and one
pair per 8-column block. Row-wise softmax statistics want it as a matrix
(rows, cols) so each thread can walk its two rows.
"""

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from fa4.common.masking import pair_layout


def acc_as_rows_cols(acc: cute.Tensor) -> cute.Tensor:
    """((2,2,V),M,N) accumulator -> ((2,M),(2,V,N)): rows first, then columns."""
    shp = acc.layout.shape
    std = acc.layout.stride
    mn = cute.make_layout(
        ((shp[0][1], shp[1]), (shp[0][0], shp[0][2], shp[2])),
        stride=((std[0][1], std[1]), (std[0][0], std[0][2], std[2])),
    )
    return cute.make_tensor(acc.iterator, mn)


def transpose_view(t: cute.Tensor) -> cute.Tensor:
    """Swap the first two modes of a shared-memory tensor (same bytes, other operand role)."""
    shape = (t.shape[1], t.shape[0], *t.shape[2:])
    order = (1, 0, *range(2, cute.rank(t)))
    return cute.composition(t, cute.make_ordered_layout(shape, order=order))


class LaneShare(NamedTuple):
    """How the 8 lanes of a warp that hold the same accumulator columns split a per-column
    statistic: lane l keeps ``per`` values, at columns ``col0 + (l // quads) * stride + offsets[i]``
    (col0 its first column), and column c's value lives in lane ``(c // per) * quads + l % quads``,
    register ``c % per``."""

    per: int
    quads: int
    stride: int
    offsets: tuple[int, ...]


def lane_share(c0_mn: cute.Tensor, ncol: int) -> LaneShare:
    """The LaneShare of an SM90 WGMMA accumulator viewed as (rows, cols) with ``ncol`` columns a
    thread, from thread 0's static column offsets (``c0_mn``, fa4.common.masking). A warp's lanes
    l and l' hold the same columns iff l % 4 == l' % 4 (the columns come in pairs 0, 1, 8, 9, ...
    from 2 * (l % 4)): the 8 lanes of a quad position share them. Checked at trace time."""
    offsets = [c0_mn[0, c][1] for c in range(ncol)]
    lanes = 8
    if ncol % (2 * lanes) or not pair_layout(offsets):
        raise ValueError(f"lane_share: {ncol} columns in the layout {offsets} are not the WGMMA accumulator's pairs "
                         f"0, 1, 8, 9, ... in a multiple of {2 * lanes}")
    per = ncol // lanes
    return LaneShare(per, 4, 4 * per, tuple(offsets[:per]))


@cute.jit
def load_share(sStat: cute.Tensor, share: LaneShare, col0, stage):
    """This lane's share of a row statistic in shared memory (``sStat[col, stage]``): ``share.per``
    fp32 registers, the columns its lane group hands out."""
    t = cute.make_rmem_tensor((share.per,), Float32)
    base = col0 + (cute.arch.lane_idx() // share.quads) * share.stride
    for i in cutlass.range_constexpr(share.per):
        t[i] = sStat[base + share.offsets[i], stage]
    return t


@cute.jit
def shared_stat(tStat: cute.Tensor, share: LaneShare, c: cutlass.Constexpr):
    """Column ``c``'s statistic from the lane of this lane's quad position that holds it.

    The source lane's quad bits come from the segment mask of shfl's c operand (PTX: lane j =
    (laneid & segmask) | (b & ~segmask)), so b is an immediate: the 8 source lanes of a column
    would otherwise each hold a register across the loop (they spilled with varlen)."""
    segmask = share.quads - 1
    return cute.arch.shuffle_sync(tStat[c % share.per], (c // share.per) * share.quads,
                                  mask_and_clamp=(segmask << 8) | 31)
