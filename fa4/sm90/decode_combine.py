"""The split-KV combine for the decode kernel: O = sum_s exp(LSE_s - LSE) O_s, LSE = logsumexp_s LSE_s.

One warp per output row (sequence, query head, new token); each lane owns head_dim / 32 adjacent
columns. The row's combine (:class:`SplitCombiner`) is shared by the combine kernel and by the
decode kernel's fused combine (the last split CTA of a row block combines it, fa4.sm90.decode).

Latency, not bandwidth, is its cost (a decode row has a few KB of partials): lane s reads split
s's LSE, so the max is one load and a warp reduction, and each lane's weight reaches the others
by a shuffle; the partial-O loads of a row are unrolled so several are in flight at once. Splits
whose range was empty carry LSE = -inf and weigh zero; a row with no key at all (every split
-inf) gives O = 0 and LSE = -inf. In the fused combine the partials were written by other CTAs
of the same grid: the ticket's acquire and the CTA barrier after it order these loads after those
stores (the LSEs load from L2, ld.global.cg: their lines hold other row blocks' LSEs too).

``pdl``: the kernel is launched as a programmatic dependent of the decode kernel (which triggers
its dependents as it starts), so its launch overlaps the decode; griddepcontrol.wait holds every
thread until the decode grid has finished and its writes are visible.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import CopyG2ROp, LoadCacheMode

from fa4.common.constants import LOG2_E
from fa4.common.exp2 import exp2_mufu

ROWS_PER_CTA = 4  # warps per CTA, one row each
LN2 = 0.6931471805599453
# Partial-O loads a lane keeps in flight per row (the inner loop's unroll): 16 splits, the heuristic's
# count at batch 1, in one L2 round trip.
LOADS_IN_FLIGHT = 16


class SplitCombiner:
    """One warp combines one row's partials; constants fixed per compiled kernel."""

    def __init__(self, dtype, head_dim: int, has_lse: bool):
        self.dtype = dtype
        self.head_dim = head_dim
        self.has_lse = has_lse
        self.cols = head_dim // 32  # columns per lane

    @cute.jit
    def load_lse(self, mLSEp: cute.Tensor, s: Int32, batch: Int32, head: Int32, token: Int32) -> Float32:
        atom = cute.make_copy_atom(CopyG2ROp(), Float32, num_bits_per_copy=32, load_cache_mode=LoadCacheMode.GLOBAL)
        r = cute.make_rmem_tensor((1,), Float32)
        cute.copy(atom, cute.local_tile(mLSEp[None, batch, head, token], (1,), (s,)), r)
        return r[0]

    @cute.jit
    def row(self, mOp: cute.Tensor, mLSEp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, batch: Int32,
            head: Int32, token: Int32, lane: Int32, num_splits: Int32):
        """mOp (splits, B, Hq, Sq, D) and mLSEp (splits, B, Hq, Sq) fp32 -> mO (B, Sq, Hq, D), mLSE (B, Hq, Sq)."""
        # Lane s holds split s's LSE (the first 32 splits); more splits fold into the lane's max.
        lse0 = -Float32.inf
        if lane < num_splits:
            lse0 = self.load_lse(mLSEp, lane, batch, head, token)
        m = lse0
        for s in cutlass.range(lane + 32, num_splits, 32, unroll=1):
            m = cute.arch.fmax(m, self.load_lse(mLSEp, s, batch, head, token))
        m = cute.arch.warp_reduction_max(m)
        acc = cute.make_rmem_tensor((self.cols,), Float32)
        acc.fill(0.0)
        lse = -Float32.inf
        if m != -Float32.inf:
            total_w = Float32(0.0)
            for c in cutlass.range(0, num_splits, 32, unroll=1):
                lse_lane = lse0
                if c > 0:
                    lse_lane = -Float32.inf
                    if c + lane < num_splits:
                        lse_lane = self.load_lse(mLSEp, c + lane, batch, head, token)
                w_lane = exp2_mufu((lse_lane - m) * LOG2_E)  # 0 for an empty split (-inf)
                total_w = total_w + w_lane
                n_here = cutlass.min(32, num_splits - c)
                for g in cutlass.range(0, n_here, LOADS_IN_FLIGHT, unroll=1):
                    # Every load of the group first, then the FMAs: ptxas keeps an interleaved
                    # load-FMA sequence in order, one round trip per split.
                    rOp = cute.make_rmem_tensor(cute.make_layout((LOADS_IN_FLIGHT, self.cols), stride=(self.cols, 1)),
                                                Float32)
                    for j in cutlass.range_constexpr(LOADS_IN_FLIGHT):
                        if g + j < n_here:
                            cute.autovec_copy(
                                cute.local_tile(mOp[c + g + j, batch, head, token, None], (self.cols,), (lane,)),
                                rOp[j, None])
                    for j in cutlass.range_constexpr(LOADS_IN_FLIGHT):
                        w = cute.arch.shuffle_sync(w_lane, g + j)  # split c + g + j's weight, from its lane
                        if g + j < n_here:
                            for k in cutlass.range_constexpr(self.cols):
                                acc[k] = acc[k] + w * rOp[j, k]
            total_w = cute.arch.warp_reduction_sum(total_w)
            inv = cute.arch.rcp_approx(total_w)
            for k in cutlass.range_constexpr(self.cols):
                acc[k] = acc[k] * inv
            lse = m + cute.math.log2(total_w, fastmath=True) * LN2
        rO = cute.make_rmem_tensor((self.cols,), self.dtype)
        rO.store(acc.load().to(self.dtype))
        cute.autovec_copy(rO, cute.local_tile(mO[batch, token, head, None], (self.cols,), (lane,)))
        if cutlass.const_expr(self.has_lse):
            if lane == 0:
                mLSE[batch, head, token] = lse


class DecodeCombineSm90:
    def __init__(self, dtype, head_dim: int, has_lse: bool, pdl: bool = False):
        self.combiner = SplitCombiner(dtype, head_dim, has_lse)
        self.pdl = pdl

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
            stream=stream, use_pdl=self.pdl,
        )

    @cute.kernel
    def kernel(self, mOp: cute.Tensor, mLSEp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        num_splits, _, heads, seqlen_q = mLSEp.shape
        total = mOp.shape[1] * heads * seqlen_q
        row = bidx * ROWS_PER_CTA + tidx // 32
        if cutlass.const_expr(self.pdl):
            # Launched early, beside the decode grid: nothing it wrote is read before it has finished.
            cute.arch.griddepcontrol_wait()
        if row < total:
            token = row % seqlen_q
            head = (row // seqlen_q) % heads
            batch = row // (seqlen_q * heads)
            self.combiner.row(mOp, mLSEp, mO, mLSE, batch, head, token, tidx % 32, num_splits)
