"""Pre- and postprocess kernels of the Hopper backward.

Preprocess, one thread per query row (rows padded to fa4.sm90.bwd_compile.SEQ_PAD):
  D[row]     = sum_d dO[row, d] * O[row, d]            (fp32; 0 on padded rows)
  LSE2[row]  = LSE[row] * log2(e), and +inf where the forward saw no key (LSE = -inf) or on
               padded rows, so that P = 2^(S*scale*log2e - LSE2) is exactly 0 there instead
               of NaN (masked S = -inf minus LSE = -inf).
  dQacc[row] = 0
Postprocess, one thread per row: out[row] = acc[row] * scale in the output dtype (dQ from its
fp32 accumulator, and dK/dV under GQA).

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

