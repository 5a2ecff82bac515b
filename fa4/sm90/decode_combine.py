"""The split-KV combine for the decode kernel: O = sum_s exp(LSE_s - LSE) O_s, LSE = logsumexp_s LSE_s.

One warp per output row (sequence, query head, new token); each lane owns head_dim / 32 adjacent
columns. The partial LSEs are read by every lane (a broadcast load each), so the weights need no
shuffle; splits whose range was empty carry LSE = -inf and weigh zero; a row with no key at all
(every split -inf) gives O = 0 and LSE = -inf.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32

from fa4.common.constants import LOG2_E
from fa4.common.exp2 import exp2_mufu

ROWS_PER_CTA = 4  # warps per CTA, one row each
LN2 = 0.6931471805599453


class DecodeCombineSm90:
    def __init__(self, dtype, head_dim: int, has_lse: bool):
        self.dtype = dtype
        self.head_dim = head_dim
        self.has_lse = has_lse
        self.cols = head_dim // 32  # columns per lane

    @cute.jit
    def __call__(
        self,
        mOp: cute.Tensor,  # (num_splits, batch, heads_q, seqlen_q, head_dim) fp32
        mLSEp: cute.Tensor,  # (num_splits, batch, heads_q, seqlen_q) fp32
        mO: cute.Tensor,  # (batch, seqlen_q, heads_q, head_dim)
        mLSE: cute.Tensor,  # (batch, heads_q, seqlen_q) fp32, or None
        stream: cuda.CUstream,
    ):
        total = mOp.shape[1] * mOp.shape[2] * mOp.shape[3]
        self.kernel(mOp, mLSEp, mO, mLSE).launch(
            grid=((total + ROWS_PER_CTA - 1) // ROWS_PER_CTA, 1, 1), block=[32 * ROWS_PER_CTA, 1, 1],
            stream=stream,
        )

    @cute.kernel
    def kernel(self, mOp: cute.Tensor, mLSEp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        num_splits, _, heads, seqlen_q = mLSEp.shape
        total = mOp.shape[1] * heads * seqlen_q
        row = bidx * ROWS_PER_CTA + tidx // 32
        if row < total:
            token = row % seqlen_q
            head = (row // seqlen_q) % heads
            batch = row // (seqlen_q * heads)
            m = -Float32.inf
            for s in cutlass.range(num_splits, unroll=1):
                m = cute.arch.fmax(m, mLSEp[s, batch, head, token])
            acc = cute.make_rmem_tensor((self.cols,), Float32)
            acc.fill(0.0)
            total_w = Float32(0.0)
            lse = -Float32.inf
            if m != -Float32.inf:
                for s in cutlass.range(num_splits, unroll=1):
                    w = exp2_mufu((mLSEp[s, batch, head, token] - m) * LOG2_E)
                    total_w = total_w + w
                    gOp = cute.local_tile(mOp[s, batch, head, token, None], (self.cols,), (lane,))
                    rOp = cute.make_rmem_tensor((self.cols,), Float32)
                    cute.autovec_copy(gOp, rOp)
                    for j in cutlass.range_constexpr(self.cols):
                        acc[j] = acc[j] + w * rOp[j]
                inv = cute.arch.rcp_approx(total_w)
                for j in cutlass.range_constexpr(self.cols):
                    acc[j] = acc[j] * inv
                lse = m + cute.math.log2(total_w, fastmath=True) * LN2
            rO = cute.make_rmem_tensor((self.cols,), self.dtype)
            rO.store(acc.load().to(self.dtype))
            cute.autovec_copy(rO, cute.local_tile(mO[batch, token, head, None], (self.cols,), (lane,)))
            if cutlass.const_expr(self.has_lse):
                if lane == 0:
                    mLSE[batch, head, token] = lse
