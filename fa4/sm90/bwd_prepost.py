"""Pre- and postprocess kernels of the Hopper backward.

Preprocess, per query row (rows padded to fa4.sm90.bwd_config.SEQ_PAD):
  D[row]     = sum_d dO[row, d] * O[row, d] - dLSE[row] (fp32; 0 on padded rows). The dLSE term
               is the gradient through the returned LSE (when the loss uses it): dLSE/dS = P,
               so dS = P * (dP - D) takes it in D (a variant compiled with has_dlse).
  LSE2[row]  = LSE[row] * log2(e), and +inf where the forward saw no key (LSE = -inf) or on
               padded rows, so that P = 2^(S*scale*log2e - LSE2) is exactly 0 there instead
               of NaN (masked S = -inf minus LSE = -inf).
  dQacc[row] = 0 for the rows below ``zero_rows``: all of them, except in the deterministic
               backward, whose first dQ turn of a query tile stores instead of adding, so only
               the tiles no key tile reaches need zeros (fa4.common.bwd_schedule.dq_zero_rows;
               varlen: per sequence, from its key count, a variant compiled with det_tile_m).
Postprocess: out = acc * scale in the output dtype. dQ comes from an accumulator kept in the
main kernel's fragment order (BwdPostprocessDq, below); the GQA dK/dV accumulators are row-major
(BwdPostprocess).

Varlen (compile-time ``varlen``): the packed tensors come as a batch of one, a CTA is (tile, head,
sequence) with the sequence's rows from cu_seqlens (and seqused), and the fp32 side buffers hold
each sequence in its padded region (fa4.common.varlen.padded_offset); a tile past the sequence's
end exits at once.

These are memory-bound: what matters is that every warp-wide load and store covers whole
32-byte sectors (consecutive threads on consecutive 16 bytes of a row).
"""

from __future__ import annotations

import operator

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32

from fa4.common import bwd_schedule
from fa4.common import varlen as vlen
from fa4.common.constants import LOG2_E
from fa4.sm90.bwd_config import SEQ_PAD

ROWS_PER_CTA = 128
# A varlen sequence's padded region is whole SEQ_PAD tiles; the preprocess writes whole CTA tiles in it.
assert SEQ_PAD % ROWS_PER_CTA == 0
VEC16 = 8  # 16-bit elements per 16-byte vector
VEC32 = 4  # fp32 elements per 16-byte vector
DQ_WGS = 2  # consumer warpgroups of the main kernel; each computes half of the dQ tile
DQ_THREADS = 128 * DQ_WGS
POST_GROUP = 8  # preprocess and GQA dK/dV postprocess: passes whose loads are issued before their stores


def row_lanes(vectors: int) -> int:
    """Threads sharing one row of ``vectors`` 16-byte pieces: the largest power of two that divides
    it (at most a warp), so the rows of a pass tile the CTA exactly and a row's sum is finished with
    butterfly shuffles. Each thread then takes vectors // lanes pieces, lanes pieces apart (96:
    12 pieces, 4 lanes x 3, every warp access still whole 64-byte runs of 8 rows)."""
    lanes = 1
    while vectors % (2 * lanes) == 0 and 2 * lanes <= 32:
        lanes *= 2
    return lanes


# ---------------------------------------------------------------- the dQ accumulator format
# The main kernel adds each (tile_m x d) dQ tile into the fp32 accumulator in the order of its
# WGMMA register fragments, not row-major: thread t of warpgroup w keeps F = tile_m * d / 256
# values, stored as F/4 groups of 4 with consecutive threads on consecutive 16 bytes. Both the
# shared-memory staging (16-byte stores without bank conflicts; row-major fp32 rows 512 bytes
# apart put 8 rows on the same banks) and the global reduction (one linear bulk add per tile)
# then move whole vectors. The postprocess reads a tile back through the same MMA partition.
def make_dq_mma(dtype, head_dim: int, split: str = "head_dim", ds_key_major: bool = False):
    """dQ = dS K: A = dS (query index contiguous; ``ds_key_major``: key index contiguous, as the
    S accumulator of qm_tile_n writes it), B = K^T. The two warpgroups split head_dim (each an
    N = d/2 half of every row) or, with split 'rows', the query rows (64 each, N = d). The
    accumulator's fragment order, the dQ accumulator's format, is the same for either A."""
    import cutlass.utils.hopper_helpers as sm90_utils

    mnmaj = cute.nvgpu.OperandMajorMode.MN
    a_major = cute.nvgpu.OperandMajorMode.K if ds_key_major else mnmaj
    if split == "rows":
        return sm90_utils.make_trivial_tiled_mma(dtype, dtype, a_major, mnmaj, Float32, (DQ_WGS, 1, 1), (64, head_dim))
    return sm90_utils.make_trivial_tiled_mma(
        dtype, dtype, a_major, mnmaj, Float32, (1, DQ_WGS, 1), (64, head_dim // DQ_WGS)
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
    """D, LSE2 and the zeroed dQ accumulator for ROWS_PER_CTA query rows of one (batch, head).

    Memory-bound (it reads O and dO once, writes the fp32 accumulator once), so the access
    pattern is the kernel: d/8 consecutive threads share a row and each loads 16 bytes of O and
    dO (row_lanes: fewer threads, several pieces each, where d/8 is no power of two), so a
    warp's loads cover whole rows (a thread per row put 32 rows, H*d*2 bytes apart,
    under every load instruction: 4x the reference's time on the H200 in Nsight Compute). The
    row's dot product is finished with shuffles within those d/8 lanes. Loads are clamped to
    the last row instead of branched around, so each group of passes issues all its loads first.
    """

    def __init__(self, dtype, head_dim: int, head_dim_v: int | None = None, has_dlse: bool = False,
                 varlen: bool = False, has_sink: bool = False, det_tile_m: int = 0):
        self.dtype = dtype
        self.head_dim = head_dim  # the dQ accumulator's width
        self.head_dim_v = head_dim_v or head_dim  # O's and dO's
        self.has_dlse = has_dlse
        self.varlen = varlen
        # A learnable sink's gradient, dsink_h = -sum over rows of 2^(sink_h log2 e - LSE2) D: each
        # row's term is written beside its D (padded rows and rows with LSE -inf: 0), so the host
        # finishes it with one fixed-order sum instead of five elementwise passes over LSE2 and D.
        self.has_sink = has_sink
        # Varlen, deterministic: the main kernel's query tile. Each sequence's rows to zero follow from
        # its own lengths (bwd_schedule.dq_zero_rows), which only the device reads; 0 zeroes every row.
        self.det_tile_m = det_tile_m

    @cute.jit
    def __call__(
        self,
        mO: cute.Tensor,  # (batch, seqlen_q, heads, dv)
        mdO: cute.Tensor,  # (batch, seqlen_q, heads, dv)
        mLSE: cute.Tensor,  # (batch, heads, seqlen_q) fp32, natural log
        mLSE2: cute.Tensor,  # (batch, heads, seqlen_pad) fp32 out
        mDsum: cute.Tensor,  # (batch, heads, seqlen_pad) fp32 out
        mdQacc: cute.Tensor,  # (batch, heads, seqlen_pad, d) fp32 out (zeroed), compact rows
        mdLSE: cute.Tensor,  # (batch, heads, seqlen_q) fp32: the LSE's gradient (has_dlse), or None
        mCuSeqlens: cute.Tensor,  # varlen: (B+1,) int32 cu_seqlens_q, else None
        mSeqUsed: cute.Tensor,  # varlen: (B,) int32 seqused_q, or None
        mSink: cute.Tensor,  # has_sink: (heads,) fp32 sink logits, else None
        mSinkTerm: cute.Tensor,  # has_sink: (batch, heads, seqlen_pad) fp32 out, else None
        max_seqlen: cutlass.Int32,  # varlen: the longest sequence's rows; else unused
        zero_rows: cutlass.Int32,  # the dQ sums' rows to zero, from the first (bwd_schedule.dq_zero_rows)
        mCuSeqlensK: cute.Tensor,  # varlen with det_tile_m: (B+1,) int32 cu_seqlens_k, else None
        mSeqUsedK: cute.Tensor,  # varlen with det_tile_m: (B,) int32 seqused_k, or None
        zero_right: cutlass.Int32,  # varlen with det_tile_m: the right bound (0 causal, -1 none)
        stream: cuda.CUstream,
    ):
        grid = (mLSE2.shape[2] // ROWS_PER_CTA, mLSE2.shape[1], mLSE2.shape[0])
        if cutlass.const_expr(self.varlen):
            grid = ((max_seqlen + ROWS_PER_CTA - 1) // ROWS_PER_CTA, mLSE2.shape[1], mCuSeqlens.shape[0] - 1)
        self.kernel(mO, mdO, mLSE, mLSE2, mDsum, mdQacc, mdLSE, mCuSeqlens, mSeqUsed, mSink, mSinkTerm,
                    zero_rows, mCuSeqlensK, mSeqUsedK, zero_right).launch(
            grid=grid, block=[ROWS_PER_CTA, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mO, mdO, mLSE, mLSE2, mDsum, mdQacc, mdLSE, mCuSeqlens, mSeqUsed, mSink, mSinkTerm, zero_rows,
               mCuSeqlensK, mSeqUsedK, zero_right):
        bx, head, batch = cute.arch.block_idx()
        sink = None
        if cutlass.const_expr(self.has_sink):
            sink = (mSink[head] * Float32(LOG2_E), mSinkTerm)
        if cutlass.const_expr(self.varlen):
            off, seqlen = vlen.seq_rows(mCuSeqlens, mSeqUsed, batch)
            if bx * ROWS_PER_CTA < seqlen:
                pad = vlen.padded_offset(off, batch, SEQ_PAD)
                dlse = None
                if cutlass.const_expr(self.has_dlse):
                    dlse = cute.domain_offset((0, 0, off), mdLSE)
                seq_sink = None
                if cutlass.const_expr(self.has_sink):
                    seq_sink = (sink[0], cute.domain_offset((0, 0, pad), mSinkTerm))
                seq_zero = zero_rows
                if cutlass.const_expr(self.det_tile_m > 0):
                    _, seqlen_k = vlen.seq_rows(mCuSeqlensK, mSeqUsedK, batch)
                    seq_zero = bwd_schedule.dq_zero_rows(seqlen, seqlen_k, self.det_tile_m, zero_right)
                self.rows(
                    cute.domain_offset((0, off, 0, 0), mO), cute.domain_offset((0, off, 0, 0), mdO),
                    cute.domain_offset((0, 0, off), mLSE), cute.domain_offset((0, 0, pad), mLSE2),
                    cute.domain_offset((0, 0, pad), mDsum), cute.domain_offset((0, 0, pad, 0), mdQacc), dlse,
                    bx, head, 0, seqlen, seq_sink, seq_zero,
                )
        else:
            self.rows(mO, mdO, mLSE, mLSE2, mDsum, mdQacc, mdLSE, bx, head, batch, mO.shape[1], sink, zero_rows)

    @cute.jit
    def rows(self, mO, mdO, mLSE, mLSE2, mDsum, mdQacc, mdLSE, bx, head, batch, seqlen, sink, zero_rows):
        tidx, _, _ = cute.arch.thread_idx()
        d = self.head_dim
        lanes = row_lanes(self.head_dim_v // VEC16)  # threads per row
        per_thread = self.head_dim_v // VEC16 // lanes
        rows_per_pass = ROWS_PER_CTA // lanes
        chunk = tidx % lanes
        # The LSE row first: a load behind the D stores below could not be issued before them.
        row = bx * ROWS_PER_CTA + tidx
        lse = mLSE[batch, head, cutlass.min(row, seqlen - 1)]
        # The passes in groups of POST_GROUP: all loads of a group, then its D stores. A store
        # between two passes' loads keeps the later loads behind it (the compiler cannot tell
        # mDsum from mO), one pass in flight per thread: 32 bytes, too few to fill HBM.
        for g in cutlass.range_constexpr(0, lanes, POST_GROUP):
            prows = [bx * ROWS_PER_CTA + p * rows_per_pass + tidx // lanes for p in range(g, min(g + POST_GROUP, lanes))]
            dsums, lses = [], []
            for prow in prows:
                src = cutlass.min(prow, seqlen - 1)
                if cutlass.const_expr(self.has_sink):
                    lses.append(mLSE[batch, head, src])
                part = Float32(0.0)
                for j in cutlass.range_constexpr(per_thread):
                    o = cute.make_rmem_tensor((VEC16,), self.dtype)
                    do = cute.make_rmem_tensor((VEC16,), self.dtype)
                    cute.autovec_copy(cute.local_tile(mO[batch, src, head, None], (VEC16,), (j * lanes + chunk,)), o)
                    cute.autovec_copy(cute.local_tile(mdO[batch, src, head, None], (VEC16,), (j * lanes + chunk,)), do)
                    dot = (o.load().to(Float32) * do.load().to(Float32)).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
                    part = dot if j == 0 else part + dot
                dsum = cute.arch.warp_reduction(part, operator.add, threads_in_group=lanes)
                if cutlass.const_expr(self.has_dlse):
                    dsum = dsum - mdLSE[batch, head, src]
                dsums.append(dsum)
            for i, prow in enumerate(prows):
                if chunk == 0:
                    val = Float32(0.0)  # padded rows: D = 0
                    if prow < seqlen:
                        val = dsums[i]
                    mDsum[batch, head, prow] = val
                    if cutlass.const_expr(self.has_sink):
                        term = Float32(0.0)
                        if prow < seqlen:
                            if lses[i] != -Float32.inf:
                                term = -cute.math.exp2(sink[0] - lses[i] * Float32(LOG2_E), fastmath=True) * val
                        sink[1][batch, head, prow] = term
        lse2 = Float32.inf
        if row < seqlen:
            if lse != -Float32.inf:
                lse2 = lse * Float32(LOG2_E)
        mLSE2[batch, head, row] = lse2
        # The CTA's accumulator rows are one contiguous ROWS_PER_CTA * d run: 16-byte stores,
        # consecutive threads on consecutive 16 bytes.
        if bx * ROWS_PER_CTA < zero_rows:
            gAcc = cute.local_tile(mdQacc[batch, head, None, None], (ROWS_PER_CTA, d), (bx, 0))
            flat = cute.make_tensor(gAcc.iterator, cute.make_layout(ROWS_PER_CTA * d))
            zeros = cute.make_rmem_tensor((VEC32,), Float32)
            zeros.fill(0.0)
            for k in cutlass.range_constexpr(d // VEC32):
                cute.autovec_copy(zeros, cute.local_tile(flat, (VEC32,), (k * ROWS_PER_CTA + tidx,)))


class BwdPostprocess:
    """out = acc * scale for the row-major GQA dK/dV accumulators: d/4 consecutive threads per
    row (fewer where d/4 is no power of two or over a warp: fa4.sm90.bwd_prepost.row_lanes), 16-byte loads of the fp32 row (coalesced across the warp), 8-byte stores."""

    def __init__(self, dtype, head_dim: int, varlen: bool = False):
        self.dtype = dtype
        self.head_dim = head_dim
        self.varlen = varlen

    @cute.jit
    def __call__(
        self,
        mAcc: cute.Tensor,  # (batch, heads, seqlen_pad, d) fp32
        mOut: cute.Tensor,  # (batch, seqlen, heads, d) dtype
        scale: Float32,
        mCuSeqlens: cute.Tensor,  # varlen: (B+1,) int32 cu_seqlens_k, else None
        mSeqUsed: cute.Tensor,  # varlen: (B,) int32 seqused_k, or None
        max_seqlen: cutlass.Int32,  # varlen: the longest sequence's rows; else unused
        stream: cuda.CUstream,
    ):
        grid = (mAcc.shape[2] // ROWS_PER_CTA, mAcc.shape[1], mAcc.shape[0])
        if cutlass.const_expr(self.varlen):
            grid = ((max_seqlen + ROWS_PER_CTA - 1) // ROWS_PER_CTA, mAcc.shape[1], mCuSeqlens.shape[0] - 1)
        self.kernel(mAcc, mOut, scale, mCuSeqlens, mSeqUsed).launch(grid=grid, block=[ROWS_PER_CTA, 1, 1],
                                                                   stream=stream)

    @cute.kernel
    def kernel(self, mAcc, mOut, scale: Float32, mCuSeqlens, mSeqUsed):
        bx, head, batch = cute.arch.block_idx()
        if cutlass.const_expr(self.varlen):
            off, seqlen = vlen.seq_rows(mCuSeqlens, mSeqUsed, batch)
            if bx * ROWS_PER_CTA < seqlen:
                pad = vlen.padded_offset(off, batch, SEQ_PAD)
                self.rows(cute.domain_offset((0, 0, pad, 0), mAcc), cute.domain_offset((0, off, 0, 0), mOut), scale,
                          bx, head, 0, seqlen)
        else:
            self.rows(mAcc, mOut, scale, bx, head, batch, mOut.shape[1])

    @cute.jit
    def rows(self, mAcc, mOut, scale: Float32, bx, head, batch, seqlen):
        tidx, _, _ = cute.arch.thread_idx()
        lanes = row_lanes(self.head_dim // VEC32)
        per_thread = self.head_dim // VEC32 // lanes
        rows_per_pass = ROWS_PER_CTA // lanes
        chunk = tidx % lanes
        # The loads of POST_GROUP passes first, then their stores: the accumulator's rows up to the
        # CTA's last are allocated (seqlen_pad, or the sequence's padded region), so only the stores
        # need the row bound. A branch around each pass's load kept ptxas from issuing the next
        # pass's load before this pass's store: one memory latency a pass (~2.1 TB/s at hd128).
        group = min(POST_GROUP, lanes)
        for g in cutlass.range_constexpr(lanes // group):
            prows = [bx * ROWS_PER_CTA + (g * group + q) * rows_per_pass + tidx // lanes for q in range(group)]
            accs = [cute.make_rmem_tensor((VEC32,), Float32) for _ in range(group * per_thread)]
            for q, row in enumerate(prows):
                for j in cutlass.range_constexpr(per_thread):
                    cute.autovec_copy(cute.local_tile(mAcc[batch, head, row, None], (VEC32,), (j * lanes + chunk,)),
                                      accs[q * per_thread + j])
            for q, row in enumerate(prows):
                if row < seqlen:
                    for j in cutlass.range_constexpr(per_thread):
                        out = cute.make_rmem_tensor((VEC32,), self.dtype)
                        out.store((accs[q * per_thread + j].load() * scale).to(self.dtype))
                        cute.autovec_copy(out, cute.local_tile(mOut[batch, row, head, None], (VEC32,),
                                                               (j * lanes + chunk,)))


class BwdPostprocessDq:
    """dQ = acc * scale from the fragment-ordered accumulator: one CTA per (tile, head, batch).

    Each of the 256 threads reads its fragment (16-byte loads, coalesced across the warp). Written
    straight from the fragment, dQ would leave as 2-byte stores scattered over 8 rows per warp;
    instead the tile goes through shared memory (rows padded by 16 bytes so the fragment's 8 rows
    per warp land on different banks) and leaves as 16-byte row-contiguous stores.
    """

    def __init__(self, dtype, head_dim: int, tile_m: int, dq_split: str = "head_dim", varlen: bool = False,
                 pair: bool = False):
        self.dtype = dtype
        self.head_dim = head_dim
        self.tile_m = tile_m
        self.dq_split = dq_split  # the main kernel's: its fragments are placed by the same MMA
        self.varlen = varlen
        # cluster_exchange (fa4.common.bwd_pair): a tile is two column halves, each in the fragment
        # order of a (tile_m, d/2) dQ MMA, the half of the cluster's CTA r at offset r tile_m d/2.
        self.pair = pair
        self.cols = head_dim // 2 if pair else head_dim

    @cute.jit
    def __call__(
        self,
        mAcc: cute.Tensor,  # (batch, heads, seqlen_pad, d) fp32, tiles in fragment order
        mOut: cute.Tensor,  # (batch, seqlen, heads, d) dtype
        scale: Float32,
        mCuSeqlens: cute.Tensor,  # varlen: (B+1,) int32 cu_seqlens_q, else None
        mSeqUsed: cute.Tensor,  # varlen: (B,) int32 seqused_q, or None
        max_seqlen: cutlass.Int32,  # varlen: the longest sequence's rows; else unused
        stream: cuda.CUstream,
    ):
        tiled_mma = make_dq_mma(self.dtype, self.cols, self.dq_split)
        num_m = (mOut.shape[1] + self.tile_m - 1) // self.tile_m
        num_b = mAcc.shape[0]
        if cutlass.const_expr(self.varlen):
            num_m = (max_seqlen + self.tile_m - 1) // self.tile_m
            num_b = mCuSeqlens.shape[0] - 1
        sOut_layout = cute.make_layout((self.tile_m, self.head_dim), stride=(self.head_dim + VEC16, 1))
        self.kernel(tiled_mma, mAcc, mOut, scale, sOut_layout, mCuSeqlens, mSeqUsed).launch(
            grid=(num_m, mAcc.shape[1], num_b), block=[DQ_THREADS, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, mAcc, mOut, scale: Float32, sOut_layout: cute.Layout, mCuSeqlens,
               mSeqUsed):
        m, head, batch = cute.arch.block_idx()
        if cutlass.const_expr(self.varlen):
            off, seqlen = vlen.seq_rows(mCuSeqlens, mSeqUsed, batch)
            if m * self.tile_m < seqlen:
                pad = vlen.padded_offset(off, batch, SEQ_PAD)
                self.tile(tiled_mma, cute.domain_offset((0, 0, pad, 0), mAcc), cute.domain_offset((0, off, 0, 0), mOut),
                          scale, sOut_layout, m, head, 0, seqlen)
        else:
            self.tile(tiled_mma, mAcc, mOut, scale, sOut_layout, m, head, batch, mOut.shape[1])

    @cute.jit
    def tile(self, tiled_mma, mAcc, mOut, scale: Float32, sOut_layout: cute.Layout, m, head, batch, seqlen):
        tidx, _, _ = cute.arch.thread_idx()
        d = self.head_dim
        smem = cutlass.memory.SmemAllocator()
        sOut = smem.allocate_tensor(self.dtype, sOut_layout, byte_alignment=16)  # (tile_m, d), padded rows
        thr = tiled_mma.get_slice(tidx)
        gAcc = cute.local_tile(mAcc[batch, head, None, None], (self.tile_m, d), (m, 0))
        cols = self.cols
        lay = dq_frag_layout(self.tile_m, cols)
        (_, _), (value_stride, _) = dq_frag_shape_stride(self.tile_m, cols)
        for h in cutlass.range_constexpr(d // cols):
            acc = thr.make_fragment_C(thr.partition_shape_C((self.tile_m, cols)))
            # The thread's first value: 16-byte aligned (tiles and 4-value groups are), which the
            # pointer arithmetic cannot prove, so it is stated for the vector loads.
            first = gAcc.iterator + (h * self.tile_m * cols + cute.crd2idx(((0, 0), tidx), lay))
            ptr = cute.make_ptr(Float32, first.toint(), cute.AddressSpace.gmem, assumed_align=16)
            frag = cute.make_tensor(ptr, cute.make_layout((4, cute.size(acc) // 4), stride=value_stride))
            cute.autovec_copy(frag, dq_frag_view(acc))
            out = cute.make_rmem_tensor_like(acc, self.dtype)
            out.store((acc.load() * scale).to(self.dtype))
            cute.autovec_copy(out, thr.partition_C(cute.flat_divide(sOut, (self.tile_m, cols))[None, None, 0, h]))
        cute.arch.sync_threads()
        lanes = row_lanes(d // VEC16)
        per_thread = d // VEC16 // lanes
        rows_per_pass = DQ_THREADS // lanes
        chunk = tidx % lanes
        for p in cutlass.range_constexpr(self.tile_m // rows_per_pass):
            r = p * rows_per_pass + tidx // lanes
            row = m * self.tile_m + r
            if row < seqlen:
                for j in cutlass.range_constexpr(per_thread):
                    cute.autovec_copy(
                        cute.local_tile(sOut[r, None], (VEC16,), (j * lanes + chunk,)),
                        cute.local_tile(mOut[batch, row, head, None], (VEC16,), (j * lanes + chunk,)),
                    )
