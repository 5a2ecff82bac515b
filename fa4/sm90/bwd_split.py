"""dkv_split 'head_dim': the backward's work split for head dims whose dK/dV do not fit a thread.

With dkv_split 'keys' (fa4.sm90.bwd) each consumer warpgroup owns 64 key rows and holds dK and
dV over all of head_dim: 64 x (d + dv) fp32 per 128 threads, d/2 + dv/2 registers a thread
(192 at head_dim 192, 256 at 256: over the 240 a consumer gets). Here both consumers share one
64-row key tile (tile_n 64) and split every GEMM's N between them:

    S^T, dP^T  (64 keys x tile_m): warpgroup w computes the queries [w tile_m/2, (w+1) tile_m/2)
    dV += P^T dO, dK += dS^T Q   : warpgroup w computes the columns [w dv/2, ...) / [w d/2, ...)
    dQ = dS K                    : as before (half of head_dim each, or 64 rows each)

dK and dV then need all of P^T and dS^T, half of which the other warpgroup computed: both go
through shared memory (sP, sdS; dS is there for dQ anyway), written once per step behind one
barrier of the 256 consumers, and the dV and dK WGMMAs read them as SS operands. A thread then
holds (d + dv)/4 accumulator registers (128 at head_dim 256) beside S^T and dP^T (tile_m/4
each): see fa4.sm90.bwd_config.consumer_registers.

The K-major dK operand dS^T is the MN-major dQ operand dS read transposed: a 128-byte swizzle
atom of 64 queries x 8 keys is the same bytes either way, so one buffer serves both GEMMs.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, tensor_utils
from cutlass.cute.nvgpu import warp

from fa4.common import mma
from fa4.common.regs import opaque

ROWS = 64  # the shared key tile: one WGMMA M
SPLIT_WGS = 2


def swizzle_width(width: int, n_slice: int) -> int:
    """Elements per row of the swizzle atom of a K-major (row width ``width``) 16-bit tile that
    another GEMM reads MN-major in column slices of ``n_slice`` (a warpgroup's WGMMA N).

    The tile helpers pick the widest atom that divides the row (64 elements: 128-byte swizzle),
    but a slice must be a whole number of atoms (or one atom a whole number of slices): the
    partition of a (64, 3)-atom row of 192 into two slices of 96 does not exist, nor of a
    (32, 3) row of 96 into slices of 48. There the atom narrows to the widest that divides both
    (192 / 96: 32 elements, 64-byte swizzle; 96 / 48: 16, 32-byte). Otherwise it is the helpers'
    own choice, so the layouts of the head dims that always fitted do not change."""
    w0 = next(w for w in (64, 32, 16, 8) if width % w == 0)
    if n_slice % w0 == 0 or (width == w0 and w0 % n_slice == 0):
        return w0
    return next(w for w in (64, 32, 16, 8) if width % w == 0 and n_slice % w == 0)


def k_major_layout(kind: str, tiler_mnk: tuple, dtype, stages: int, n_slice: int):
    """make_smem_layout_a / _b (row-major: K contiguous) of ``tiler_mnk`` with the swizzle atom
    of swizzle_width(K, n_slice)."""
    row_major = tensor_utils.LayoutEnum.ROW_MAJOR
    k = tiler_mnk[2]
    w = swizzle_width(k, n_slice)
    make = sm90_utils.make_smem_layout_a if kind == "a" else sm90_utils.make_smem_layout_b
    if w == next(x for x in (64, 32, 16, 8) if k % x == 0):
        return make(row_major, tiler_mnk, dtype, stages)
    atom = sm90_utils.make_smem_layout_atom(sm90_utils.get_smem_layout_atom(row_major, dtype, w), dtype)
    shape = (tiler_mnk[0], k) if kind == "a" else (tiler_mnk[1], k)
    return cute.tile_to_shape(atom, cute.append(shape, stages), order=(0, 1, 2))


def make_split_mmas(dtype, tile_m: int, head_dim: int, head_dim_v: int):
    """(sdp_mma, dk_mma, dv_mma): the two consumers side by side on N, all three SS."""
    kmaj = cute.nvgpu.OperandMajorMode.K
    mnmaj = cute.nvgpu.OperandMajorMode.MN
    # S^T = K Q^T and dP^T = V dO^T: 64 keys on M, each warpgroup tile_m/2 queries on N.
    sdp = sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, kmaj, kmaj, Float32, (1, SPLIT_WGS, 1), (ROWS, tile_m // SPLIT_WGS)
    )
    # dK += dS^T Q, dV += P^T dO: A = the shared 64 x tile_m tile (queries contiguous: K-major),
    # B = Q^T / dO^T (head_dim contiguous: MN-major); each warpgroup half of N = d or dv.
    dk = sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, kmaj, mnmaj, Float32, (1, SPLIT_WGS, 1), (ROWS, head_dim // SPLIT_WGS)
    )
    dv = sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, kmaj, mnmaj, Float32, (1, SPLIT_WGS, 1), (ROWS, head_dim_v // SPLIT_WGS)
    )
    return sdp, dk, dv


class DkvSplitSteps:
    """The part of a mainloop step that differs under dkv_split 'head_dim' (a FlashBwdSm90 mixin)."""

    @cute.jit
    def store_s_tile(self, sdp_mma, src_as_S: cute.Tensor, dst: cute.Tensor, ctid):
        """A 16-bit tile in the S^T accumulator layout into a queries-contiguous shared tile."""
        if cutlass.const_expr(self.ds_stmatrix):
            # A thread holds two adjacent queries of one key per 8x8 block: the non-transposed
            # stmatrix register order, each block row one 16-byte chunk of the swizzled tile.
            st = cute.make_tiled_copy_C(
                cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), sdp_mma
            )
            st_thr = st.get_slice(opaque(ctid))
            cute.copy(st, st_thr.retile(src_as_S), st_thr.partition_D(dst))
        else:
            cute.autovec_copy(src_as_S, sdp_mma.get_slice(opaque(ctid)).partition_C(dst))

    @cute.jit
    def publish_p_ds(self, sdp_mma, tdVrP_as_S, tdKrdS_as_S, sP, sdSt, ds_buf, ctid, bar_ds_free, bar_ds_full,
                     num_consumer_threads: cutlass.Constexpr):
        """P^T and dS^T of this step into buffer ``ds_buf``, visible to both consumers' WGMMAs (and
        the exchange's bulk copy to the peer) when it returns."""
        if cutlass.const_expr(self.ds_stages == 1):
            # One buffer each: both consumers' previous dV, dQ and dK GEMMs must have read them.
            cute.arch.barrier(barrier_id=bar_ds_free, number_of_threads=num_consumer_threads)
        self.store_s_tile(sdp_mma, tdVrP_as_S, sP[None, None, ds_buf], ctid)
        self.store_s_tile(sdp_mma, tdKrdS_as_S, sdSt[None, None, ds_buf], ctid)
        # Generic-proxy stores, read by the WGMMAs and the bulk copy (async proxy).
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=bar_ds_full, number_of_threads=num_consumer_threads)

    @cute.jit
    def split_exchange_and_gemms(
        self, sdp_mma, dkv_mma, dv_mma, dq_mma, frag, accs, state, ds_buf, ctid, bar_ds_free, bar_ds_full,
        num_consumer_threads: cutlass.Constexpr,
    ):
        """P^T and dS^T into shared memory, one barrier, then dV, dQ and dK (committed in that order;
        dk_before_dq: dV, dK, dQ)."""
        _, _, _, _, tdVrdOt, tdKrQt, tdQrdS, tdQrKt, _, _, tdVsP, sP, tdKsdSt, sdSt = frag
        _, _, acc_dV, acc_dK, acc_dQ, _, _, tdVrP_as_S, tdKrdS_as_S, _, _ = accs
        self.publish_p_ds(sdp_mma, tdVrP_as_S, tdKrdS_as_S, sP, sdSt, ds_buf, ctid, bar_ds_free, bar_ds_full,
                          num_consumer_threads)
        self.gemms_dv_dq_dk(
            (dv_mma, acc_dV, tdVsP, ds_buf, tdVrdOt, state.index),
            (dkv_mma, acc_dK, tdKsdSt, ds_buf, tdKrQt, state.index),
            (dq_mma, acc_dQ, tdQrdS, ds_buf, tdQrKt, 0),
        )

    @cute.jit
    def gemms_dv_dq_dk(self, dv, dk, dq):
        """dV += A B, dQ = A B and dK += A B of a step whose P and dS are published, one commit group
        each, dV first; dk_before_dq issues dK before dQ (Q's slot frees while dQ runs). Each argument
        is fa4.common.mma.gemm_staged's (tiled MMA, acc, A, A's stage, B, B's stage): the keys-on-M
        layouts pass dV = P^T dO and dK = dS^T Q, the queries-on-M tiling (fa4.sm90.bwd_qm) dV^T =
        dO^T P and dK^T = Q^T dS."""
        mma.gemm_staged(dv, False)
        if cutlass.const_expr(self.dk_before_dq):
            mma.gemm_staged(dk, False)
        mma.gemm_staged(dq, True)
        if cutlass.const_expr(not self.dk_before_dq):
            mma.gemm_staged(dk, False)
