"""Pre- and postprocess kernels of the Hopper backward.

Preprocess, one thread per query row (rows padded to fa4.sm90.bwd_compile.SEQ_PAD):
  D[row]     = sum_d dO[row, d] * O[row, d]            (fp32; 0 on padded rows)
  LSE2[row]  = LSE[row] * log2(e), and +inf where the forward saw no key (LSE = -inf) or on
               padded rows, so that P = 2^(S*scale*log2e - LSE2) is exactly 0 there instead
               of NaN (masked S = -inf minus LSE = -inf).
  dQacc[row] = 0
Postprocess: out = acc * scale in the output dtype. dQ comes from an accumulator kept in the
main kernel's fragment order (BwdPostprocessDq, below); the GQA dK/dV accumulators are row-major
(BwdPostprocess, one thread per row).

These are memory-bound and small next to the main kernel; a thread per row keeps them simple
(each row is one contiguous run of head_dim elements, loaded with vector loads).
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32

ROWS_PER_CTA = 128
LOG2E = math.log2(math.e)
DQ_WGS = 2  # consumer warpgroups of the main kernel; each computes half of dQ's columns
DQ_THREADS = 128 * DQ_WGS


# ---------------------------------------------------------------- the dQ accumulator format
# The main kernel adds each (tile_m x d) dQ tile into the fp32 accumulator in the order of its
# WGMMA register fragments, not row-major: thread t of warpgroup w keeps F = tile_m * d / 256
# values, stored as F/4 groups of 4 with consecutive threads on consecutive 16 bytes. Both the
# shared-memory staging (16-byte stores without bank conflicts; row-major fp32 rows 512 bytes
# apart put 8 rows on the same banks) and the global reduction (one linear bulk add per tile)
# then move whole vectors. The postprocess reads a tile back through the same MMA partition.
def make_dq_mma(dtype, head_dim: int):
    """dQ = dS K: A = dS (query index contiguous), B = K^T; the two warpgroups split head_dim."""
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import warpgroup

    mnmaj = warpgroup.OperandMajorMode.MN
    return sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, mnmaj, mnmaj, Float32, (1, DQ_WGS, 1), (64, head_dim // DQ_WGS)
    )


def dq_frag_shape_stride(tile_m: int, head_dim: int) -> tuple[tuple, tuple]:
    """((4, F/4), (thread, warpgroup)) and its strides in elements of one dQ tile."""
    f = tile_m * head_dim // DQ_THREADS
    chunk = tile_m * head_dim // DQ_WGS
    return ((4, f // 4), (128, DQ_WGS)), ((1, 4 * 128), (4, chunk))


def dq_frag_layout(tile_m: int, head_dim: int) -> cute.Layout:
    shape, stride = dq_frag_shape_stride(tile_m, head_dim)
    return cute.make_layout(shape, stride=stride)


def dq_frag_view(acc: cute.Tensor) -> cute.Tensor:
    """A thread's dQ accumulator fragment as (4, F/4) in register order."""
    return cute.make_tensor(acc.iterator, cute.make_layout((4, cute.size(acc) // 4)))


class BwdPreprocess:
    def __init__(self, dtype, head_dim: int):
        self.dtype = dtype
        self.head_dim = head_dim

    @cute.jit
    def __call__(
        self,
        mO: cute.Tensor,  # (batch, seqlen_q, heads, d)
        mdO: cute.Tensor,  # (batch, seqlen_q, heads, d)
        mLSE: cute.Tensor,  # (batch, heads, seqlen_q) fp32, natural log
        mLSE2: cute.Tensor,  # (batch, heads, seqlen_pad) fp32 out
        mDsum: cute.Tensor,  # (batch, heads, seqlen_pad) fp32 out
        mdQacc: cute.Tensor,  # (batch, heads, seqlen_pad, d) fp32 out (zeroed)
        stream: cuda.CUstream,
    ):
        grid = (mLSE2.shape[2] // ROWS_PER_CTA, mLSE2.shape[1], mLSE2.shape[0])
        self.kernel(mO, mdO, mLSE, mLSE2, mDsum, mdQacc).launch(
            grid=grid, block=[ROWS_PER_CTA, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, mO, mdO, mLSE, mLSE2, mDsum, mdQacc):
        tidx, _, _ = cute.arch.thread_idx()
        bx, head, batch = cute.arch.block_idx()
        row = bx * ROWS_PER_CTA + tidx
        seqlen = mO.shape[1]
        zeros = cute.make_rmem_tensor((self.head_dim,), Float32)
        zeros.fill(0.0)
        cute.autovec_copy(zeros, mdQacc[batch, head, row, None])
        dsum = Float32(0.0)
        lse2 = Float32.inf
        if row < seqlen:
            o = cute.make_rmem_tensor((self.head_dim,), self.dtype)
            do = cute.make_rmem_tensor((self.head_dim,), self.dtype)
            cute.autovec_copy(mO[batch, row, head, None], o)
            cute.autovec_copy(mdO[batch, row, head, None], do)
            prod = o.load().to(Float32) * do.load().to(Float32)
            dsum = prod.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            lse = mLSE[batch, head, row]
            if lse != -Float32.inf:
                lse2 = lse * Float32(LOG2E)
        mDsum[batch, head, row] = dsum
        mLSE2[batch, head, row] = lse2


class BwdPostprocess:
    def __init__(self, dtype, head_dim: int):
        self.dtype = dtype
        self.head_dim = head_dim

    @cute.jit
    def __call__(
        self,
        mAcc: cute.Tensor,  # (batch, heads, seqlen_pad, d) fp32
        mOut: cute.Tensor,  # (batch, seqlen, heads, d) dtype
        scale: Float32,
        stream: cuda.CUstream,
    ):
        grid = (mAcc.shape[2] // ROWS_PER_CTA, mAcc.shape[1], mAcc.shape[0])
        self.kernel(mAcc, mOut, scale).launch(grid=grid, block=[ROWS_PER_CTA, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mAcc, mOut, scale: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        bx, head, batch = cute.arch.block_idx()
        row = bx * ROWS_PER_CTA + tidx
        if row < mOut.shape[1]:
            acc = cute.make_rmem_tensor((self.head_dim,), Float32)
            cute.autovec_copy(mAcc[batch, head, row, None], acc)
            out = cute.make_rmem_tensor((self.head_dim,), self.dtype)
            out.store((acc.load() * scale).to(self.dtype))
            cute.autovec_copy(out, mOut[batch, row, head, None])



class BwdPostprocessDq:
    """dQ = acc * scale from the fragment-ordered accumulator: one CTA per (tile, head, batch).

    Each of the 256 threads reads its fragment (16-byte loads, coalesced across the warp) and
    writes it through the dQ MMA's partition of the output tile, dropping rows past seqlen_q.
    """

    def __init__(self, dtype, head_dim: int, tile_m: int):
        self.dtype = dtype
        self.head_dim = head_dim
        self.tile_m = tile_m

    @cute.jit
    def __call__(
        self,
        mAcc: cute.Tensor,  # (batch, heads, seqlen_pad, d) fp32, tiles in fragment order
        mOut: cute.Tensor,  # (batch, seqlen, heads, d) dtype
        scale: Float32,
        stream: cuda.CUstream,
    ):
        tiled_mma = make_dq_mma(self.dtype, self.head_dim)
        num_m = (mOut.shape[1] + self.tile_m - 1) // self.tile_m
        self.kernel(tiled_mma, mAcc, mOut, scale).launch(
            grid=(num_m, mAcc.shape[1], mAcc.shape[0]), block=[DQ_THREADS, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, mAcc, mOut, scale: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        m, head, batch = cute.arch.block_idx()
        d = self.head_dim
        thr = tiled_mma.get_slice(tidx)
        gAcc = cute.local_tile(mAcc[batch, head, None, None], (self.tile_m, d), (m, 0))
        acc = thr.make_fragment_C(thr.partition_shape_C((self.tile_m, d)))
        lay = dq_frag_layout(self.tile_m, d)
        # The thread's first value: 16-byte aligned (tiles and 4-value groups are), which the
        # pointer arithmetic cannot prove, so it is stated for the vector loads.
        first = gAcc.iterator + cute.crd2idx(((0, 0), tidx), lay)
        ptr = cute.make_ptr(Float32, first.toint(), cute.AddressSpace.gmem, assumed_align=16)
        (_, _), (value_stride, _) = dq_frag_shape_stride(self.tile_m, d)
        frag = cute.make_tensor(ptr, cute.make_layout((4, cute.size(acc) // 4), stride=value_stride))
        cute.autovec_copy(frag, dq_frag_view(acc))
        out = cute.make_rmem_tensor_like(acc, self.dtype)
        out.store((acc.load() * scale).to(self.dtype))
        gOut = cute.local_tile(mOut[batch, None, head, None], (self.tile_m, d), (m, 0))
        cOut = cute.local_tile(cute.make_identity_tensor((mOut.shape[1], d)), (self.tile_m, d), (m, 0))
        tOg = thr.partition_C(gOut)
        tOc = thr.partition_C(cOut)
        for i in cutlass.range_constexpr(cute.size(out)):
            if tOc[i][0] < mOut.shape[1]:
                tOg[i] = out[i]
