"""WGMMA issue shared by the Hopper kernels."""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

from fa4.common.constants import THREADS_PER_WG


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


@cute.jit
def gemm_staged(spec, zero_init: cutlass.Constexpr):
    """acc (+)= A[stage] B[stage], one commit group; ``spec`` is (tiled MMA, acc, A, A's stage, B,
    B's stage), A and B fragments with their ring stages last. The stages are selected here, at
    the GEMM: selected earlier, an operand's uniform descriptor arithmetic moves with them."""
    tiled_mma, acc, a, a_stage, b, b_stage = spec
    gemm(tiled_mma, acc, a[None, None, None, a_stage], b[None, None, None, b_stage], zero_init=zero_init)
    warpgroup.commit_group()


def wg_slices(tidx, *tiled_mmas):
    """Each tiled MMA's slice at the first thread of ``tidx``'s warpgroup, for shared-memory operand
    fragments (their descriptors are the same for all 128 threads of a warpgroup). The index is
    warp-uniform (make_warp_uniform), so the descriptor arithmetic stays in uniform registers; a
    slice at the thread's own index makes it vector arithmetic with an R2UR before every WGMMA.
    Accumulator and register-operand fragments still need the thread's own slice."""
    wg_first = cute.arch.make_warp_uniform(tidx // THREADS_PER_WG) * THREADS_PER_WG
    return tuple(m.get_slice(wg_first) for m in tiled_mmas)
