"""Views of WGMMA register fragments shared by the kernels.

A WGMMA accumulator fragment of a 64xN tile has, per thread, the layout
((2, 2, N/8), MMA_M, MMA_N): two adjacent columns, two rows eight apart, and one
pair per 8-column block. Row-wise softmax statistics want it as a matrix
(rows, cols) so each thread can walk its two rows.
"""

import cutlass.cute as cute


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
