"""WGMMA issue shared by the Hopper kernels."""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup


@cute.jit
def gemm(tiled_mma, acc, tA, tB, zero_init: cutlass.Constexpr):
    """acc (+)= tA @ tB over the K blocks of the fragments (no commit, no wait)."""
    # wgmma.fence: the accumulator / A registers were written by ordinary instructions.
    warpgroup.fence()
    # A private atom per call: setting ACCUMULATE on the shared tiled MMA inside a
    # dynamic loop would leak an SSA value out of the loop body.
    atom = cute.make_mma_atom(tiled_mma.op)
    for k in cutlass.range_constexpr(cute.size(tA, mode=[2])):
        atom.set(warpgroup.Field.ACCUMULATE, (not zero_init) or k != 0)
        cute.gemm(atom, acc, tA[None, None, k], tB[None, None, k], acc)
