"""Decode attention for Hopper (sm_90a): new query tokens against a (paged) KV cache, split-KV.

One CTA per (m block, CTA head, split, sequence), 160 threads:
  * warps 0-3, the consumer warpgroup: load the CTA's 64 query rows into shared memory, then
    S = QK^T and O += PV on WGMMA with the online softmax in registers (fa4.common.softmax),
    and write O (or, split, the fp32 partial O and its LSE) straight from the accumulators.
  * warp 4, the producer: one TMA load per K tile and per V tile into ``kv_stages``-deep rings.
    A paged cache is viewed (row in page, head_dim, kv head, page); the producer reads the
    tile's page from page_table, so the box coordinates are (tile in page, head, page). A
    contiguous cache (B, Sk, Hkv, D) is the same view with one page per sequence.

Rows (pack_gqa): row r of a CTA head holds query head ``head0 + r // seqlen_q`` at new token
``r % seqlen_q``; packed, a CTA head is a KV head and its group's query heads share each K/V
byte, otherwise it is one query head. Causal masking is bottom-right per sequence: token t
sees keys j <= t + seqlen_k - seqlen_q with seqlen_k = cache_seqlens[b].

Split-KV: a sequence's KV tiles are cut into ``num_splits`` contiguous ranges of
ceil(tiles / num_splits); a CTA whose range is empty writes O = 0 and LSE = -inf, which the
combine weighs by zero. The combine is a second kernel (fa4.sm90.decode_combine; with
combine="pdl" launched as a programmatic dependent, which this kernel triggers as it starts), or
with combine="fused" the last CTA of each row block to finish: after its partials it takes a
ticket (an atomic add on one int32 per (sequence, row block)); the CTA that draws num_splits - 1
has every split's partials visible and combines them into O, then stores 0 back so the next
launch (or CUDA-graph replay) starts from zero without a memset. The valid lengths are read on the
device only, so a launch never syncs with the host and its grid depends on shapes alone. Keys
past a sequence's end are masked in S and, in its last tile, zeroed in V (the cache may hold NaN
there).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.tensor_utils as tensor_utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup

from fa4.common import convert, masking, mma, softmax
from fa4.common.layout import acc_as_rows_cols
from fa4.common.tma import seq_tiles
from fa4.sm90.decode_combine import SplitCombiner
from fa4.sm90.decode_config import CONSUMER_THREADS, NUM_THREADS, ROWS_PER_CTA, DecodeConfigSm90

BAR_Q = 1  # the consumer warpgroup's Q tile is in shared memory
BAR_V_TAIL = 2  # the last V tile's keys past the sequence end are zeroed
BAR_TICKET = 3  # fused combine: the partials are stored (then: the ticket is drawn)
PRODUCER_WARP = CONSUMER_THREADS // 32


class FlashDecodeSm90:
    def __init__(self, dtype, head_dim: int, causal: bool, paged: bool, has_seqlens: bool, split: bool,
                 has_lse: bool, config: DecodeConfigSm90):
        self.dtype = dtype
        self.head_dim = head_dim
        self.causal = causal
        self.paged = paged
        self.has_seqlens = has_seqlens
        self.split = split
        self.has_lse = has_lse
        # Derived attributes.
        self.fused = split and config.combine == "fused"
        self.pdl_primary = split and config.combine == "pdl"
        self.combiner = SplitCombiner(dtype, head_dim, has_lse)
        self.tile_n = config.tile_n
        self.kv_stages = config.kv_stages
        self.qk_tiler = (ROWS_PER_CTA, self.tile_n, head_dim)
        self.pv_tiler = (ROWS_PER_CTA, head_dim, self.tile_n)
        # 16-byte chunks of the Q tile each consumer thread loads.
        self.q_chunks = ROWS_PER_CTA * head_dim // 8 // CONSUMER_THREADS

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (batch, seqlen_q, heads_q, head_dim)
        mK: cute.Tensor,  # (num_pages, page_size, heads_kv, head_dim), or (batch, seqlen_k, heads_kv, head_dim)
        mV: cute.Tensor,  # same as mK
        mO: cute.Tensor,  # (batch, seqlen_q, heads_q, head_dim), or None when split unfused
        mLSE: cute.Tensor,  # (batch, heads_q, seqlen_q) fp32, or None
        mPageTable: cute.Tensor,  # (batch, max_pages) int32, or None (contiguous cache)
        mSeqlens: cute.Tensor,  # (batch,) int32 valid keys per sequence, or None (all of the cache)
        mOp: cute.Tensor,  # (num_splits, batch, heads_q, seqlen_q, head_dim) fp32, or None unless split
        mLSEp: cute.Tensor,  # (num_splits, batch, heads_q, seqlen_q) fp32, or None unless split
        mTicket: cute.Tensor,  # (batch, row blocks x CTA heads) int32, all 0 between launches; None unless fused
        scale_log2: Float32,  # softmax_scale * log2(e)
        num_splits: Int32,
        qh_per_cta: Int32,  # query heads per CTA head: heads_q / heads_kv packed, else 1
        stream: cuda.CUstream,
    ):
        # (row in page, d, heads, page) views, as the forward's (seq, d, heads, batch): a KV tile is a
        # plain 2-D box for TMA; V is (d, row in page, ...), the MN-major B operand of O += P V.
        mKt = cute.make_tensor(mK.iterator, cute.select(mK.layout, mode=[1, 3, 2, 0]))
        mVt = cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[3, 1, 2, 0]))
        k_major = tensor_utils.LayoutEnum.from_tensor(mKt)
        v_major = tensor_utils.LayoutEnum.from_tensor(mVt)
        qk_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, cute.nvgpu.OperandMajorMode.K, k_major.sm90_mma_major_mode(),
            Float32, (1, 1, 1), self.qk_tiler[:2],
        )
        pv_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, cute.nvgpu.OperandMajorMode.K, v_major.sm90_mma_major_mode(),
            Float32, (1, 1, 1), self.pv_tiler[:2], warpgroup.OperandSource.RMEM,
        )
        sQ_layout = sm90_utils.make_smem_layout_a(tensor_utils.LayoutEnum.ROW_MAJOR, self.qk_tiler, self.dtype, 1)
        sK_layout = sm90_utils.make_smem_layout_b(k_major, self.qk_tiler, self.dtype, self.kv_stages)
        sV_layout = sm90_utils.make_smem_layout_b(v_major, self.pv_tiler, self.dtype, self.kv_stages)
        sK_one = cute.slice_(sK_layout, (None, None, 0))
        sV_one = cute.slice_(sV_layout, (None, None, 0))
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_k, mK_tma = cpasync.make_tiled_tma_atom(g2s, mKt, sK_one, (self.tile_n, self.head_dim))
        tma_v, mV_tma = cpasync.make_tiled_tma_atom(g2s, mVt, sV_one, (self.head_dim, self.tile_n))
        self.k_bytes = cute.size_in_bytes(self.dtype, sK_one)
        self.v_bytes = cute.size_in_bytes(self.dtype, sV_one)

        @cute.struct
        class SharedStorage:
            mbar_k: cute.struct.MemRange[cutlass.Int64, self.kv_stages * 2]
            mbar_v: cute.struct.MemRange[cutlass.Int64, self.kv_stages * 2]
            ticket: cute.struct.MemRange[Int32, 1]  # fused combine: the CTA's ticket, for all consumers
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]

        self.shared_storage = SharedStorage

        batch = mQ.shape[0]
        rows = qh_per_cta * mQ.shape[1]
        num_m = (rows + ROWS_PER_CTA - 1) // ROWS_PER_CTA
        cta_heads = mQ.shape[2] // qh_per_cta
        self.kernel(
            qk_mma, pv_mma, tma_k, mK_tma, tma_v, mV_tma, mQ, mO, mLSE, mPageTable, mSeqlens, mOp, mLSEp, mTicket,
            sQ_layout, sK_layout, sV_layout, scale_log2, num_splits, qh_per_cta, mK.shape[2],
        ).launch(grid=(num_m * cta_heads, num_splits, batch), block=[NUM_THREADS, 1, 1], stream=stream,
                 min_blocks_per_mp=1)

    @cute.kernel
    def kernel(
        self,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,  # (page_size, head_dim, heads_kv, num_pages), TMA view
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,  # (head_dim, page_size, heads_kv, num_pages), TMA view
        mQ: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mPageTable: cute.Tensor,
        mSeqlens: cute.Tensor,
        mOp: cute.Tensor,
        mLSEp: cute.Tensor,
        mTicket: cute.Tensor,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        scale_log2: Float32,
        num_splits: Int32,
        qh_per_cta: Int32,
        heads_kv: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, split, batch = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if cutlass.const_expr(self.pdl_primary):
            # The combine kernel may launch now and wait (griddepcontrol.wait) beside this grid, so its
            # launch latency hides under the mainloop; it takes no smem and a few registers.
            cute.arch.griddepcontrol_launch_dependents()

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # (64, d, 1)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)  # (n, d, stages)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)  # (d, n, stages)

        producer_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, CONSUMER_THREADS // 32)
        pipe_k = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_k.data_ptr(), num_stages=self.kv_stages,
            producer_group=producer_group, consumer_group=consumers, tx_count=self.k_bytes, defer_sync=True,
        )
        pipe_v = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_v.data_ptr(), num_stages=self.kv_stages,
            producer_group=producer_group, consumer_group=consumers, tx_count=self.v_bytes, defer_sync=True,
        )
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        seqlen_q = mQ.shape[1]
        rows = qh_per_cta * seqlen_q
        num_m = (rows + ROWS_PER_CTA - 1) // ROWS_PER_CTA
        m_block = bidx % num_m
        head0 = (bidx // num_m) * qh_per_cta  # first query head of this CTA head
        kv_head = head0 // (mQ.shape[2] // heads_kv)
        page_size = mK.shape[0]
        seqlen_k = page_size
        if cutlass.const_expr(self.paged):
            seqlen_k = page_size * mPageTable.shape[1]
        if cutlass.const_expr(self.has_seqlens):
            # Never past the cache: a length over it would read other sequences' pages.
            seqlen_k = cutlass.min(mSeqlens[batch], seqlen_k)
        n_tiles = (seqlen_k + self.tile_n - 1) // self.tile_n
        per_split = (n_tiles + num_splits - 1) // num_splits
        n_lo = split * per_split
        n_hi = cutlass.min(n_lo + per_split, n_tiles)

        if warp_idx == PRODUCER_WARP:
            # ---------------- producer ----------------
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)
            k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
            v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
            tiles_per_page = page_size // self.tile_n
            for n in cutlass.range(n_lo, n_hi, unroll=1):
                page = batch
                tile_in_page = n
                if cutlass.const_expr(self.paged):
                    page = mPageTable[batch, n // tiles_per_page]
                    tile_in_page = n % tiles_per_page
                tKsK, tKgK = seq_tiles(tma_k, mK, sK, (self.tile_n, self.head_dim), kv_head, page)
                gV = cute.flat_divide(mV, (self.head_dim, self.tile_n))[None, None, 0, None, kv_head, page]
                tVsV, tVgV = cpasync.tma_partition(
                    tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2)
                )
                pipe_k.producer_acquire(k_state)
                cute.copy(tma_k, tKgK[None, tile_in_page], tKsK[None, k_state.index],
                          tma_bar_ptr=pipe_k.producer_get_barrier(k_state))
                k_state.advance()
                pipe_v.producer_acquire(v_state)
                cute.copy(tma_v, tVgV[None, tile_in_page], tVsV[None, v_state.index],
                          tma_bar_ptr=pipe_v.producer_get_barrier(v_state))
                v_state.advance()
        elif warp_idx < PRODUCER_WARP:
            # ---------------- consumer ----------------
            self.load_q(mQ, sQ[None, None, 0], tidx, batch, m_block, head0, rows, seqlen_q)
            self.consumer(
                qk_mma, pv_mma, sQ, sK, sV, pipe_k, pipe_v, mO, mLSE, mOp, mLSEp, tidx, batch, split,
                m_block, head0, rows, seqlen_q, seqlen_k, n_lo, n_hi, scale_log2,
            )
            if cutlass.const_expr(self.fused):
                self.fused_combine(mO, mLSE, mOp, mLSEp, mTicket, storage.ticket.get_tensor(cute.make_layout(1)),
                                   tidx, batch, bidx, m_block, head0, rows, seqlen_q, num_splits)

    @cute.jit
    def load_q(self, mQ, sQ, tidx, batch, m_block, head0, rows, seqlen_q):
        """The CTA's 64 packed query rows into the swizzled Q tile, 16 bytes per copy; padding rows are
        zero. Plain loads: the rows gather (head, token) pairs that no TMA box spans."""
        chunks_per_row = self.head_dim // 8
        rQ = cute.make_rmem_tensor((8,), self.dtype)
        for i in cutlass.range_constexpr(self.q_chunks):
            chunk = i * CONSUMER_THREADS + tidx
            r = chunk // chunks_per_row
            c = chunk % chunks_per_row
            row = m_block * ROWS_PER_CTA + r
            rQ.fill(0.0)
            if row < rows:
                gQ = cute.local_tile(mQ[batch, row % seqlen_q, head0 + row // seqlen_q, None], (8,), (c,))
                cute.autovec_copy(gQ, rQ)
            cute.autovec_copy(rQ, cute.local_tile(sQ[r, None], (8,), (c,)))
        # Generic-proxy stores, read by the WGMMA through the async proxy.
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=BAR_Q, number_of_threads=CONSUMER_THREADS)

    @cute.jit
    def consumer(
        self, qk_mma, pv_mma, sQ, sK, sV, pipe_k, pipe_v, mO, mLSE, mOp, mLSEp, tidx, batch, split,
        m_block, head0, rows, seqlen_q, seqlen_k, n_lo, n_hi, scale_log2,
    ):
        qk_thr = qk_mma.get_slice(tidx)
        pv_thr = pv_mma.get_slice(tidx)
        tSrQ = qk_thr.make_fragment_A(qk_thr.partition_A(sQ))[None, None, None, 0]  # (MMA, 1, K/16)
        tSrK = qk_thr.make_fragment_B(qk_thr.partition_B(sK))  # (MMA, N/8.., K/16, stages)
        tOrV = pv_thr.make_fragment_B(pv_thr.partition_B(sV))  # (MMA, d.., n/16, stages)
        acc_S = qk_thr.make_fragment_C(qk_thr.partition_shape_C((ROWS_PER_CTA, self.tile_n)))
        acc_O = pv_thr.make_fragment_C(pv_thr.partition_shape_C((ROWS_PER_CTA, self.head_dim)))
        tOrP = cute.make_rmem_tensor(pv_thr.partition_shape_A((ROWS_PER_CTA, self.tile_n)), self.dtype)
        # The A-operand register order of a 16-bit WGMMA equals the accumulator order of two adjacent
        # 8-column blocks, so P is S converted element by element (as in the forward).
        tOrP_as_S = cute.make_tensor(tOrP.iterator, acc_S.layout)
        cS = cute.make_identity_tensor((ROWS_PER_CTA, self.tile_n))
        tScS_mn = acc_as_rows_cols(qk_thr.partition_C(cS))
        c0_mn = acc_as_rows_cols(qk_mma.get_slice(0).partition_C(cS))
        row0, col0 = tScS_mn[0, 0]
        s_mn = acc_as_rows_cols(acc_S)
        o_mn = acc_as_rows_cols(acc_O)
        nrow = cute.size(s_mn, mode=[0])
        row_max = cute.make_rmem_tensor((nrow,), Float32)
        row_sum = cute.make_rmem_tensor((nrow,), Float32)
        row_scale = cute.make_rmem_tensor((nrow,), Float32)
        lse = cute.make_rmem_tensor((nrow,), Float32)
        # Keys each of this thread's rows may see: the cache's valid length, and causally (bottom-right
        # per sequence) the keys up to its token's position.
        key_limit = cute.make_rmem_tensor((nrow,), Int32)
        for r in cutlass.range_constexpr(nrow):
            key_limit[r] = seqlen_k
            if cutlass.const_expr(self.causal):
                token = (m_block * ROWS_PER_CTA + row0 + c0_mn[r, 0][0]) % seqlen_q
                key_limit[r] = cutlass.min(seqlen_k, token + 1 + seqlen_k - seqlen_q)

        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        acc_O.fill(0.0)
        for r in cutlass.range_constexpr(nrow):
            lse[r] = -Float32.inf
        if n_lo < n_hi:
            # Decode is bound by HBM bandwidth: the steps run serially (S, softmax, PV) while the
            # producer keeps kv_stages tiles in flight.
            pipe_k.consumer_wait(k_state)
            mma.gemm(qk_mma, acc_S, tSrQ, tSrK[None, None, None, k_state.index], zero_init=True)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            pipe_k.consumer_release(k_state)
            k_state.advance()
            masking.apply_key_limits(s_mn, c0_mn, key_limit, n_lo * self.tile_n + col0)
            softmax.softmax_first(s_mn, row_max, row_sum, scale_log2, frozenset())
            convert.to_packed16(acc_S, tOrP_as_S)
            pipe_v.consumer_wait(v_state)
            self.zero_v_tail(sV, v_state.index, n_lo, seqlen_k, tidx)
            mma.gemm(pv_mma, acc_O, tOrP, tOrV[None, None, None, v_state.index], zero_init=True)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            pipe_v.consumer_release(v_state)
            v_state.advance()
            for n in cutlass.range(n_lo + 1, n_hi, unroll=1):
                pipe_k.consumer_wait(k_state)
                mma.gemm(qk_mma, acc_S, tSrQ, tSrK[None, None, None, k_state.index], zero_init=True)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                pipe_k.consumer_release(k_state)
                k_state.advance()
                masking.apply_key_limits(s_mn, c0_mn, key_limit, n * self.tile_n + col0)
                need = softmax.softmax_next(s_mn, row_max, row_sum, row_scale, scale_log2, Float32(0.0),
                                            frozenset())
                if need:
                    softmax.rescale_rows(o_mn, row_scale)
                convert.to_packed16(acc_S, tOrP_as_S)
                pipe_v.consumer_wait(v_state)
                self.zero_v_tail(sV, v_state.index, n, seqlen_k, tidx)
                mma.gemm(pv_mma, acc_O, tOrP, tOrV[None, None, None, v_state.index], zero_init=False)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                pipe_v.consumer_release(v_state)
                v_state.advance()
            softmax.finalize(o_mn, row_max, row_sum, lse, scale_log2)
        self.epilogue(pv_thr, o_mn, lse, c0_mn, row0, mO, mLSE, mOp, mLSEp, tidx, batch, split, m_block,
                      head0, rows, seqlen_q)

    @cute.jit
    def fused_combine(self, mO, mLSE, mOp, mLSEp, mTicket, sTicket, tidx, batch, bidx, m_block, head0, rows,
                      seqlen_q, num_splits):
        """After this CTA's partials: draw the row block's ticket; the last of its num_splits CTAs
        combines the block's rows (a warp per row) and resets the ticket to 0."""
        # Every thread's partial stores are ordered before the ticket (the fence, made cumulative over
        # the CTA by the barrier), so the CTA that draws the last ticket sees all splits' partials.
        cute.arch.fence_acq_rel_gpu()
        cute.arch.barrier(barrier_id=BAR_TICKET, number_of_threads=CONSUMER_THREADS)
        if tidx == 0:
            sTicket[0] = cute.arch.atomic_add(mTicket[batch, None].iterator + bidx, Int32(1), sem="acq_rel",
                                              scope="gpu")
        cute.arch.barrier(barrier_id=BAR_TICKET, number_of_threads=CONSUMER_THREADS)
        if sTicket[0] == num_splits - 1:
            if tidx == 0:
                # Every split has drawn: nothing else touches the ticket in this launch.
                mTicket[batch, bidx] = Int32(0)
            for r in cutlass.range(tidx // 32, ROWS_PER_CTA, CONSUMER_THREADS // 32, unroll=1):
                row = m_block * ROWS_PER_CTA + r
                if row < rows:
                    self.combiner.row(mOp, mLSEp, mO, mLSE, batch, head0 + row // seqlen_q, row % seqlen_q,
                                      tidx % 32, num_splits)

    @cute.jit
    def zero_v_tail(self, sV, stage, n, seqlen_k, tidx):
        """Zero the V rows of tile n past the sequence's last key. Their P is 0, but a cache holds
        anything there (torch.empty pages, stale steps): 0 x NaN or 0 x inf in O += P V is NaN. K needs
        nothing: the mask overwrites those scores. Runs on the sequence's last tile only."""
        valid = seqlen_k - n * self.tile_n
        if valid < self.tile_n:
            total = (self.tile_n - valid) * self.head_dim
            for i in cutlass.range(tidx, total, CONSUMER_THREADS, unroll=1):
                sV[i % self.head_dim, valid + i // self.head_dim, stage] = self.dtype(0.0)
            # Generic-proxy stores, read by the WGMMA through the async proxy.
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=BAR_V_TAIL, number_of_threads=CONSUMER_THREADS)

    @cute.jit
    def epilogue(self, pv_thr, o_mn, lse, c0_mn, row0, mO, mLSE, mOp, mLSEp, tidx, batch, split, m_block,
                 head0, rows, seqlen_q):
        """O (16-bit) and LSE, or split the fp32 partial O and its LSE, from the accumulator registers:
        the tile's valid rows are a few (head, token) pairs, scattered in the outputs."""
        cO = cute.make_identity_tensor((ROWS_PER_CTA, self.head_dim))
        tOcO_mn = acc_as_rows_cols(pv_thr.partition_C(cO))
        for r in cutlass.range_constexpr(cute.size(o_mn, mode=[0])):
            row = m_block * ROWS_PER_CTA + row0 + c0_mn[r, 0][0]
            if row < rows:
                head = head0 + row // seqlen_q
                token = row % seqlen_q
                for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
                    col = tOcO_mn[r, c][1]
                    if cutlass.const_expr(self.split):
                        mOp[split, batch, head, token, col] = o_mn[r, c]
                    else:
                        mO[batch, token, head, col] = o_mn[r, c].to(self.dtype)
                # Each row lives in the 4 threads of a quad; the first one writes its LSE.
                if tidx % 4 == 0:
                    if cutlass.const_expr(self.split):
                        mLSEp[split, batch, head, token] = lse[r]
                    elif cutlass.const_expr(self.has_lse):
                        mLSE[batch, head, token] = lse[r]
