"""FlashAttention forward for Hopper (sm_90a) with the FA4 knobs.

Warp roles (3 warpgroups, 384 threads):
  * warpgroup 0, producer: one warp issues the TMA loads of Q (one 64-row tile per
    consumer), then K and V tiles into ``kv_stages``-deep shared-memory rings guarded
    by mbarrier pipelines. It gives most of its registers away (setmaxnreg).
  * warpgroups 1 and 2, consumers: each owns one 64-row Q tile (the two Q tiles of
    the FA4 ping-pong) and runs S = QK^T and O += PV on WGMMA, with the online
    softmax in registers and P fed to the PV WGMMA straight from registers.

Knobs (fa4.sm90.fwd_config.FwdConfigSm90) decide: tile_n, ring depth, ping-pong
barriers between the two consumers (GEMM issue order, optionally exp phases),
intra-warpgroup overlap of QK(j) with PV(j-1), the MUFU/FMA exp2 split, tau for
conditional rescaling, the tile order (LPT, head swizzle), and one CTA per tile or a
persistent grid of one CTA per SM that walks the tile order (Q stages handed back to the
producer after each tile's epilogue store has read them).

Issue 18's features, compile-time switches with runtime sizes: a sliding window (each query tile
loads only the KV tiles fa4.common.masking.kv_block_range gives and masks the edge tiles; a left
window adds a third, masked loop at the far edge), softcap (t = tanh(s scale / c) in the score
registers before the mask, on MUFU or partly on the FMA pipe, fa4.common.softcap; the softmax runs
on t with scale_log2 = c log2(e)) and learnable sinks (one more denominator term per row after the
KV loop; the LSE includes it).

Packed variable-length sequences (``varlen``, compile-time): q/k/v/o arrive as one batch of packed
rows, (1, total, heads, d), with cu_seqlens (B+1,) (and optionally seqused) on the device. The
grid is ceil(max_seqlen_q / tile_m) x heads x B; each tile reads its sequence's offset and
lengths (fa4.common.varlen), and a tile that starts past its sequence's end exits before the
producer/consumer split, so the pipelines and ping-pong barriers of the tiles that run are the
dense kernel's. Q/K/V are loaded by TMA from the packed tensors shifted to the sequence's start
(rows past its end are masked by the per-sequence lengths); O is stored by TMA when the 64 rows
lie inside the sequence, else by predicated stores that stop at its end (the next sequence's
rows are never written).
"""

from __future__ import annotations


import cuda.bindings.driver as cuda
import cutlass
import cutlass.memory
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, tensor_utils
from cutlass.cute.nvgpu import cpasync, warpgroup

from fa4.common import convert, masking, mma, scheduling, softcap, softmax, varlen
from fa4.common.constants import LOG2_E
from fa4.common.exp2 import emulated_indices
from fa4.common.layout import acc_as_rows_cols
from fa4.common.regs import pin_before
from fa4.common.tma import seq_tiles
from fa4.sm90.fwd_config import (
    ROWS_PER_WG,
    THREADS_PER_WG,
    FwdConfigSm90,
    reg_split,
)

# Named barrier ids (0 is __syncthreads). Two per purpose: one per consumer warpgroup.
# Named barrier ids (0 is __syncthreads): one per consumer warpgroup and purpose.
BAR_EPILOGUE = 1  # 1..3: a consumer's own 128 threads around the O staging store
BAR_MMA_TURN = 4  # 4..6: ping-pong turn to issue WGMMAs
BAR_EXP_TURN = 7  # 7..9: ping-pong turn to run the exp phase
BAR_P = 10  # 10..12: a consumer's P tile is in shared memory (p_operand 'smem')


class FlashFwdSm90:
    def __init__(self, dtype, head_dim: int, causal: bool, has_lse: bool, config: FwdConfigSm90,
                 head_dim_v: int | None = None, *, has_window_left: bool = False, has_window_right: bool = False,
                 has_softcap: bool = False, has_sink: bool = False, varlen: bool = False):
        self.dtype = dtype
        self.head_dim = head_dim
        self.head_dim_v = head_dim_v or head_dim
        self.causal = causal
        self.has_lse = has_lse
        self.config = config
        # Issue 18's features (fa4.common.masking, fa4.common.softcap): compile-time switches, the
        # window sizes and the cap are runtime arguments.
        self.has_window_left = has_window_left
        self.has_window_right = has_window_right
        self.has_softcap = has_softcap
        self.has_sink = has_sink
        self.varlen = varlen
        # Derived attributes.
        self.tile_m = config.tile_m
        self.tile_n = config.tile_n
        self.kv_stages = config.kv_stages
        # One consumer warpgroup per 64-row Q tile: 2 (the FA4 ping-pong pair) or 3 (a
        # round robin, which gives the exp-bound hd64 case a third softmax in flight).
        self.num_wg = config.tile_m // ROWS_PER_WG
        self.q_stages = self.num_wg
        self.num_threads = THREADS_PER_WG * (1 + self.num_wg)
        self.ctas_per_sm = config.ctas_per_sm
        self.regs_consumer, self.regs_producer = reg_split(config)
        self.pingpong_mma = config.pingpong in ("mma", "mma_exp")
        self.pingpong_exp = config.pingpong == "mma_exp"
        self.overlap = config.intra_wg_overlap
        self.exp_pin = config.exp_pin
        self.p_smem = config.p_operand == "smem"
        self.persistent = config.persistent
        if varlen and self.persistent:
            # violations() rejects it: the persistent tile walk does not skip empty varlen tiles yet.
            raise ValueError("varlen kernels run one CTA per tile (persistent off)")
        # One mainloop step, chosen at trace time: QK(j) and PV(j-1) in flight together, or serial.
        self.step = self.step_overlap if self.overlap else self.step_serial
        # Columns of a thread's S row evaluated on the FMA pipe: the row has tile_n / 4
        # elements per thread (two per 8-column block).
        self.emulated = frozenset(
            emulated_indices(self.tile_n // 4, config.exp2_emu_frac, config.exp2_emu_pattern)
        )
        # Columns whose softcap tanh runs on the FMA pipe, spread over each group of 8 so that
        # FMA-pipe and MUFU work interleave in program order.
        self.tanh_fma = frozenset(
            emulated_indices(self.tile_n // 4, config.tanh_fma_frac if has_softcap else 0.0, "spread")
        )
        self.qk_tiler = (ROWS_PER_WG, self.tile_n, head_dim)
        self.pv_tiler = (ROWS_PER_WG, self.head_dim_v, self.tile_n)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (batch, seqlen_q, heads_q, head_dim)
        mK: cute.Tensor,  # (batch, seqlen_k, heads_kv, head_dim)
        mV: cute.Tensor,  # (batch, seqlen_k, heads_kv, head_dim_v)
        mO: cute.Tensor,  # (batch, seqlen_q, heads_q, head_dim_v)
        mLSE: cute.Tensor,  # (batch, heads_q, seqlen_q) fp32, or None
        mSink: cute.Tensor,  # (heads_q,) fp32 sink logits, or None
        mCuSeqlensQ: cute.Tensor,  # varlen: (B+1,) int32 row offsets of the sequences in q, else None
        mCuSeqlensK: cute.Tensor,  # varlen: (B+1,) int32 in k/v, else None
        mSeqUsedQ: cute.Tensor,  # varlen: (B,) int32 rows used per sequence (<= its cu_seqlens span), or None
        mSeqUsedK: cute.Tensor,  # varlen: (B,) int32 keys used per sequence, or None
        scale_log2: Float32,  # softmax_scale * log2(e); with softcap c * log2(e)
        softcap_scale: Float32,  # softmax_scale / c (unused without softcap)
        window_left: Int32,  # keys left of the diagonal a row sees (unused without has_window_left)
        window_right: Int32,  # keys right of it (unused without has_window_right)
        max_seqlen_q: Int32,  # varlen: the longest sequence's rows (the grid's m extent); else unused
        # The runtime knobs, in their declaration order (fa4.knobs.runtime_args).
        tau: Float32,
        lpt: Int32,
        head_swizzle: Int32,
        num_ctas: Int32,  # persistent: CTAs to launch (the SM count); ignored otherwise
        stream: cuda.CUstream,
    ):
        # Kernel-side views: sequence first, then head_dim, heads, batch, so a tile
        # is a plain 2-D box for TMA. V is viewed (head_dim, seqlen) because it is the
        # MN-major B operand of O += P V.
        mQ = cute.make_tensor(mQ.iterator, cute.select(mQ.layout, mode=[1, 3, 2, 0]))
        mK = cute.make_tensor(mK.iterator, cute.select(mK.layout, mode=[1, 3, 2, 0]))
        mV = cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[3, 1, 2, 0]))
        mO = cute.make_tensor(mO.iterator, cute.select(mO.layout, mode=[1, 3, 2, 0]))
        if cutlass.const_expr(self.has_lse):
            mLSE = cute.make_tensor(mLSE.iterator, cute.select(mLSE.layout, mode=[2, 1, 0]))

        q_major = tensor_utils.LayoutEnum.from_tensor(mQ)
        k_major = tensor_utils.LayoutEnum.from_tensor(mK)
        v_major = tensor_utils.LayoutEnum.from_tensor(mV)
        qk_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, q_major.sm90_mma_major_mode(), k_major.sm90_mma_major_mode(),
            Float32, (1, 1, 1), self.qk_tiler[:2],
        )
        pv_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, cute.nvgpu.OperandMajorMode.K, v_major.sm90_mma_major_mode(),
            Float32, (1, 1, 1), self.pv_tiler[:2],
            warpgroup.OperandSource.SMEM if self.p_smem else warpgroup.OperandSource.RMEM,
        )
        # P through shared memory: one (64 x tile_n) K-major tile per consumer warpgroup.
        sP_layout = sm90_utils.make_smem_layout_a(tensor_utils.LayoutEnum.ROW_MAJOR, self.pv_tiler, self.dtype, self.num_wg)
        sQ_layout = sm90_utils.make_smem_layout_a(q_major, self.qk_tiler, self.dtype, self.q_stages)
        sK_layout = sm90_utils.make_smem_layout_b(k_major, self.qk_tiler, self.dtype, self.kv_stages)
        sV_layout = sm90_utils.make_smem_layout_b(v_major, self.pv_tiler, self.dtype, self.kv_stages)
        sQ_one = cute.slice_(sQ_layout, (None, None, 0))
        sK_one = cute.slice_(sK_layout, (None, None, 0))
        sV_one = cute.slice_(sV_layout, (None, None, 0))
        # O is staged in the consumer's own Q buffer (same shape and swizzle) once its last QK
        # GEMM has retired, so the epilogue needs no extra shared memory. A narrower O
        # (head_dim_v < head_dim) gets its own swizzled tile at the start of each Q stage: the
        # stage stride stays the Q buffer's, so no consumer's O lands in another's Q.
        sO_layout = sQ_layout
        if cutlass.const_expr(self.head_dim_v != self.head_dim):
            sO_one = cute.tile_to_shape(
                sm90_utils.make_smem_layout_atom(
                    sm90_utils.get_smem_layout_atom(tensor_utils.LayoutEnum.ROW_MAJOR, self.dtype, self.head_dim_v),
                    self.dtype,
                ),
                (ROWS_PER_WG, self.head_dim_v), (0, 1),
            )
            sO_staged = cute.make_layout(
                cute.append(sO_one.outer.shape, self.q_stages),
                stride=cute.append(sO_one.outer.stride, cute.cosize(sQ_one)),
            )
            sO_layout = cute.make_composed_layout(sO_one.inner, 0, sO_staged)
        sO_one = cute.slice_(sO_layout, (None, None, 0))

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, mQ_tma = cpasync.make_tiled_tma_atom(g2s, mQ, sQ_one, (ROWS_PER_WG, self.head_dim))
        tma_k, mK_tma = cpasync.make_tiled_tma_atom(g2s, mK, sK_one, (self.tile_n, self.head_dim))
        tma_v, mV_tma = cpasync.make_tiled_tma_atom(g2s, mV, sV_one, (self.head_dim_v, self.tile_n))
        tma_o, mO_tma = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mO, sO_one, (ROWS_PER_WG, self.head_dim_v)
        )
        self.q_bytes = cute.size_in_bytes(self.dtype, sQ_one)
        self.k_bytes = cute.size_in_bytes(self.dtype, sK_one)
        self.v_bytes = cute.size_in_bytes(self.dtype, sV_one)

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, self.q_stages * 2]
            mbar_k: cute.struct.MemRange[cutlass.Int64, self.kv_stages * 2]
            mbar_v: cute.struct.MemRange[cutlass.Int64, self.kv_stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sP_layout) if self.p_smem else 8], 1024]

        self.shared_storage = SharedStorage

        vl = None
        if cutlass.const_expr(self.varlen):
            vl = (mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK, max_seqlen_q, mO)
        num_m, num_bh = scheduling.tile_grid(mQ.shape[0], self.tile_m, mQ.shape[2], mQ.shape[3], vl)
        num_tiles = num_m * num_bh
        grid = (num_tiles, 1, 1)
        if cutlass.const_expr(self.persistent):
            # One CTA per SM (the kernel needs all of an SM's shared memory), each walking the
            # tile order with a stride of the grid: the next tile's K/V loads start while the
            # current tile's last GEMMs and epilogue run, and no CTA launch sits between tiles.
            grid = (cutlass.min(num_tiles, num_ctas), 1, 1)
        self.kernel(
            qk_mma, pv_mma, tma_q, mQ_tma, tma_k, mK_tma, tma_v, mV_tma, tma_o, mO_tma, mLSE,
            sQ_layout, sK_layout, sV_layout, sP_layout, sO_layout, scale_log2, tau, head_swizzle, lpt,
            mSink, (window_left, window_right, softcap_scale), vl,
        ).launch(grid=grid, block=[self.num_threads, 1, 1], stream=stream, min_blocks_per_mp=self.ctas_per_sm,
            # All of the SM's shared memory for the CTAs (and, given here, no device query at
            # compile time: a CPU compiles this kernel too).
            preferred_smem_carveout=100)

    @cute.kernel
    def kernel(
        self,
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        tma_q: cute.CopyAtom,
        mQ: cute.Tensor,  # (seqlen_q, head_dim, heads_q, batch), TMA view
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,  # (seqlen_k, head_dim, heads_kv, batch), TMA view
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,  # (head_dim_v, seqlen_k, heads_kv, batch), TMA view
        tma_o: cute.CopyAtom,
        mO: cute.Tensor,  # (seqlen_q, head_dim_v, heads_q, batch), TMA view
        mLSE: cute.Tensor,  # (seqlen_q, heads_q, batch) fp32, or None
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        scale_log2: Float32,
        tau: Float32,
        head_swizzle: Int32,
        lpt: Int32,
        mSink: cute.Tensor,  # (heads_q,) fp32, or None
        feat: tuple,  # (window_left, window_right, softcap_scale), runtime
        vl: tuple,  # varlen: (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, mO), else None
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // THREADS_PER_WG)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # (64, d, 2)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)  # (n, d, stages)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)  # (dv, n, stages)
        sO = sQ  # (64, dv, 2): the epilogue's staging, in the Q buffers
        if cutlass.const_expr(self.head_dim_v != self.head_dim):
            sO = storage.sQ.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        sP = sQ  # placeholder: only read when p_operand is 'smem'
        if cutlass.const_expr(self.p_smem):
            sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)  # (64, n, num_wg)

        producer_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=self.q_stages,
            producer_group=producer_group,
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, THREADS_PER_WG // 32),
            tx_count=self.q_bytes, defer_sync=True,
        )
        consumers_kv = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_wg * THREADS_PER_WG // 32)
        pipe_k = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_k.data_ptr(), num_stages=self.kv_stages,
            producer_group=producer_group, consumer_group=consumers_kv,
            tx_count=self.k_bytes, defer_sync=True,
        )
        pipe_v = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_v.data_ptr(), num_stages=self.kv_stages,
            producer_group=producer_group, consumer_group=consumers_kv,
            tx_count=self.v_bytes, defer_sync=True,
        )
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        seqlen_q = mQ.shape[0]
        seqlen_k = mK.shape[0]
        num_heads = mQ.shape[2]
        num_m, num_bh = scheduling.tile_grid(seqlen_q, self.tile_m, num_heads, mQ.shape[3], vl)
        num_tiles = num_m * num_bh
        # (num_m, heads_q, heads_q * batch, heads_q / heads_kv, head swizzle, lpt): the tile decode.
        sched = (num_m, num_heads, num_bh, num_heads // mK.shape[2], head_swizzle, lpt)
        grid_size, _, _ = cute.arch.grid_dim()
        roles = (qk_mma, pv_mma, tma_q, mQ, tma_k, mK, tma_v, mV, tma_o, mO, mLSE, sQ, sK, sV, sP, sO,
                 pipe_q, pipe_k, pipe_v, warp_idx, wg_idx, tidx, bidx, num_tiles, grid_size, sched,
                 seqlen_q, seqlen_k, scale_log2, tau, mSink, feat, vl)
        if cutlass.const_expr(self.varlen):
            # A tile past its sequence's end (a shorter sequence than the longest, or an empty one)
            # exits here, every thread of the CTA alike: no load, no GEMM, no store, no barrier turn.
            m_block, _, batch = scheduling.decode_tile(bidx, num_m, num_heads, num_bh, head_swizzle, lpt)
            _, _, seq_q, _ = varlen.seq_info(vl, batch, seqlen_q, seqlen_k)
            if m_block * self.tile_m < seq_q:
                self.roles(*roles)
        else:
            self.roles(*roles)

    @cute.jit
    def roles(
        self, qk_mma, pv_mma, tma_q, mQ, tma_k, mK, tma_v, mV, tma_o, mO, mLSE, sQ, sK, sV, sP, sO,
        pipe_q, pipe_k, pipe_v, warp_idx, wg_idx, tidx, bidx, num_tiles, grid_size, sched,
        seqlen_q, seqlen_k, scale_log2, tau, mSink, feat, vl,
    ):
        """The warp roles of the CTA: the producer warp's loads, the consumers' GEMMs and epilogue."""
        if wg_idx == 0:
            # ---------------- producer ----------------
            cute.arch.setmaxregister_decrease(self.regs_producer)
            if warp_idx == 0:
                cpasync.prefetch_descriptor(tma_q)
                cpasync.prefetch_descriptor(tma_k)
                cpasync.prefetch_descriptor(tma_v)
                cpasync.prefetch_descriptor(tma_o)
                q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.q_stages)
                k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
                v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.kv_stages)
                states = (q_state, k_state, v_state)
                if cutlass.const_expr(self.persistent):
                    for tile_idx in cutlass.range(bidx, num_tiles, grid_size, unroll=1):
                        states = self.produce_tile(
                            tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, pipe_q, pipe_k, pipe_v, states,
                            tile_idx, sched, seqlen_q, seqlen_k, feat, vl,
                        )
                else:
                    self.produce_tile(
                        tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, pipe_q, pipe_k, pipe_v, states,
                        bidx, sched, seqlen_q, seqlen_k, feat, vl,
                    )
        else:
            # ---------------- consumers ----------------
            cute.arch.setmaxregister_increase(self.regs_consumer)
            cwg = wg_idx - 1  # which Q tile / ping-pong side this warpgroup is
            ctid = tidx % THREADS_PER_WG  # thread index inside the warpgroup
            self.consumer(
                qk_mma, pv_mma, tma_o, mO, mLSE, sQ, sK, sV, sP, sO, pipe_q, pipe_k, pipe_v,
                cwg, ctid, bidx, num_tiles, grid_size, sched, seqlen_q, seqlen_k, scale_log2, tau, mSink, feat, vl,
            )

    @cute.jit
    def kv_split(self, m_block, seqlen_q, seqlen_k, feat):
        """(n_block_min, n_block_max, masked right, unmasked) of a query tile: fa4.common.masking."""
        return masking.kv_mask_split(
            m_block, self.tile_m, self.tile_n, seqlen_q, seqlen_k, self.causal, self.has_window_left,
            self.has_window_right, feat[0], feat[1],
        )

    @cute.jit
    def produce_tile(
        self, tma_q, mQ, tma_k, mK, tma_v, mV, sQ, sK, sV, pipe_q, pipe_k, pipe_v, states,
        tile_idx, sched, seqlen_q, seqlen_k, feat, vl,
    ):
        """The TMA loads of one work tile: Q (one 64-row tile per consumer), then K and V from the
        last KV tile down. Returns the pipeline states, carried to the next tile."""
        q_state, k_state, v_state = states
        num_m, num_heads, num_bh, qhead_per_kvhead, head_swizzle, lpt = sched
        m_block, head, batch = scheduling.decode_tile(tile_idx, num_m, num_heads, num_bh, head_swizzle, lpt)
        head_kv = head // qhead_per_kvhead
        if cutlass.const_expr(self.varlen):
            # The packed tensors, shifted to this sequence's first row (the TMA coordinates).
            off_q, off_k, seqlen_q, seqlen_k = varlen.seq_info(vl, batch, seqlen_q, seqlen_k)
            mQ = cute.domain_offset((off_q, 0, 0, 0), mQ)
            mK = cute.domain_offset((off_k, 0, 0, 0), mK)
            mV = cute.domain_offset((0, off_k, 0, 0), mV)
            batch = 0
        # Only the KV tiles some row of this tile sees are loaded (a window skips the rest).
        n_block_min, n_block_max, _, _ = self.kv_split(m_block, seqlen_q, seqlen_k, feat)
        tQsQ, tQgQ = seq_tiles(tma_q, mQ, sQ, (ROWS_PER_WG, self.head_dim), head, batch)
        tKsK, tKgK = seq_tiles(tma_k, mK, sK, (self.tile_n, self.head_dim), head_kv, batch)
        gV = cute.flat_divide(mV, (self.head_dim_v, self.tile_n))[None, None, 0, None, head_kv, batch]
        tVsV, tVgV = cpasync.tma_partition(
            tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2)
        )
        n_first = n_block_max - 1
        # The acquire / copy / advance triples stay written out: moved into a helper, the states'
        # advance() is hidden from the DSL's loop-carried analysis of the KV loop below (the kernel
        # compiled differently, and the persistent one not at all).
        # Q of consumer 0, then the first K, so its first GEMM can start as
        # early as possible; then Q of the other consumers.
        pipe_q.producer_acquire(q_state)
        cute.copy(tma_q, tQgQ[None, m_block * self.num_wg], tQsQ[None, 0],
                  tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
        q_state.advance()
        pipe_k.producer_acquire(k_state)
        cute.copy(tma_k, tKgK[None, n_first], tKsK[None, k_state.index],
                  tma_bar_ptr=pipe_k.producer_get_barrier(k_state))
        k_state.advance()
        for w in cutlass.range_constexpr(1, self.num_wg):
            pipe_q.producer_acquire(q_state)
            cute.copy(tma_q, tQgQ[None, m_block * self.num_wg + w], tQsQ[None, w],
                      tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
            q_state.advance()
        pipe_v.producer_acquire(v_state)
        cute.copy(tma_v, tVgV[None, n_first], tVsV[None, v_state.index],
                  tma_bar_ptr=pipe_v.producer_get_barrier(v_state))
        v_state.advance()
        for i in cutlass.range(1, n_block_max - n_block_min, unroll=1):
            n = n_first - i
            pipe_k.producer_acquire(k_state)
            cute.copy(tma_k, tKgK[None, n], tKsK[None, k_state.index],
                      tma_bar_ptr=pipe_k.producer_get_barrier(k_state))
            k_state.advance()
            pipe_v.producer_acquire(v_state)
            cute.copy(tma_v, tVgV[None, n], tVsV[None, v_state.index],
                      tma_bar_ptr=pipe_v.producer_get_barrier(v_state))
            v_state.advance()
        return q_state, k_state, v_state

    @cute.jit
    def consumer(
        self, qk_mma, pv_mma, tma_o, mO, mLSE, sQ, sK, sV, sP, sO, pipe_q, pipe_k, pipe_v,
        cwg, ctid, bidx, num_tiles, grid_size, sched, seqlen_q, seqlen_k, scale_log2, tau, mSink, feat, vl,
    ):
        qk_thr = qk_mma.get_slice(ctid)
        pv_thr = pv_mma.get_slice(ctid)
        tSrQ = qk_thr.make_fragment_A(qk_thr.partition_A(sQ))  # (MMA, 1, K/16, 2)
        tSrK = qk_thr.make_fragment_B(qk_thr.partition_B(sK))  # (MMA, N/8.., K/16, stages)
        tOrV = pv_thr.make_fragment_B(pv_thr.partition_B(sV))  # (MMA, dv.., n/16, stages)
        acc_S = qk_thr.make_fragment_C(qk_thr.partition_shape_C((ROWS_PER_WG, self.tile_n)))
        acc_O = pv_thr.make_fragment_C(pv_thr.partition_shape_C((ROWS_PER_WG, self.head_dim_v)))
        tOrP = cute.make_rmem_tensor(pv_thr.partition_shape_A((ROWS_PER_WG, self.tile_n)), self.dtype)
        # The A-operand register order of a 16-bit WGMMA equals the accumulator order of
        # two adjacent 8-column blocks, so P is S converted element by element.
        tOrP_as_S = cute.make_tensor(tOrP.iterator, acc_S.layout)
        # The PV A operand: those registers, or this warpgroup's P tile in shared memory (then
        # tPsP is where each thread stores its converted P, the accumulator's own partition).
        tOA = tOrP
        tPsP = None
        if cutlass.const_expr(self.p_smem):
            tOA = pv_thr.make_fragment_A(pv_thr.partition_A(sP))[None, None, None, cwg]
            tPsP = qk_thr.partition_C(sP[None, None, cwg])
        p_out = (tOrP_as_S, tPsP)
        cS = cute.make_identity_tensor((ROWS_PER_WG, self.tile_n))
        tScS_mn = acc_as_rows_cols(qk_thr.partition_C(cS))
        # Static offsets of a thread's elements from its first one (see fa4.common.masking).
        c0_mn = acc_as_rows_cols(qk_mma.get_slice(0).partition_C(cS))
        row0, col0 = tScS_mn[0, 0]
        tScS = (c0_mn, row0, col0)
        s_mn = acc_as_rows_cols(acc_S)
        o_mn = acc_as_rows_cols(acc_O)
        nrow = cute.size(s_mn, mode=[0])
        row_max = cute.make_rmem_tensor((nrow,), Float32)
        row_sum = cute.make_rmem_tensor((nrow,), Float32)
        row_scale = cute.make_rmem_tensor((nrow,), Float32)
        frags = (acc_S, acc_O, tOA, p_out, tSrK, tOrV, tScS, s_mn, o_mn, row_max, row_sum, row_scale)

        # The turn starts at consumer 0: its predecessor in the ring hands it over once. Every
        # consumer takes the same number of turns per tile (one per GEMM issue and exp phase over
        # the same KV range), so the ring stays in step from one persistent tile to the next.
        if cutlass.const_expr(self.pingpong_mma):
            if cwg == self.num_wg - 1:
                cute.arch.barrier_arrive(barrier_id=BAR_MMA_TURN, number_of_threads=2 * THREADS_PER_WG)
        if cutlass.const_expr(self.pingpong_exp):
            if cwg == self.num_wg - 1:
                cute.arch.barrier_arrive(barrier_id=BAR_EXP_TURN, number_of_threads=2 * THREADS_PER_WG)

        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.kv_stages)
        tSrQ_wg = tSrQ[None, None, None, cwg]
        if cutlass.const_expr(self.persistent):
            # Q stage cwg is refilled once per tile: its full-barrier phase flips every tile.
            q_phase = Int32(0)
            for tile_idx in cutlass.range(bidx, num_tiles, grid_size, unroll=1):
                k_state, v_state = self.consume_tile(
                    qk_mma, pv_mma, tma_o, mO, mLSE, sO, pipe_q, pipe_k, pipe_v, k_state, v_state,
                    q_phase, frags, tSrQ_wg, pv_thr, cwg, ctid, tile_idx, sched, seqlen_q, seqlen_k,
                    scale_log2, tau, mSink, feat, vl,
                )
                q_phase = q_phase ^ 1
        else:
            self.consume_tile(
                qk_mma, pv_mma, tma_o, mO, mLSE, sO, pipe_q, pipe_k, pipe_v, k_state, v_state,
                Int32(0), frags, tSrQ_wg, pv_thr, cwg, ctid, bidx, sched, seqlen_q, seqlen_k,
                scale_log2, tau, mSink, feat, vl,
            )

    @cute.jit
    def consume_tile(
        self, qk_mma, pv_mma, tma_o, mO, mLSE, sO, pipe_q, pipe_k, pipe_v, k_state, v_state,
        q_phase, frags, tSrQ_wg, pv_thr, cwg, ctid, tile_idx, sched, seqlen_q, seqlen_k,
        scale_log2, tau, mSink, feat, vl,
    ):
        """One consumer's 64 rows of one work tile: the KV mainloop and the epilogue. Returns the
        K/V pipeline states, carried to the next tile."""
        acc_S, acc_O, tOA, p_out, tSrK, tOrV, tScS, s_mn, o_mn, row_max, row_sum, row_scale = frags
        num_m, num_heads, num_bh, _, head_swizzle, lpt = sched
        m_block, head, batch = scheduling.decode_tile(tile_idx, num_m, num_heads, num_bh, head_swizzle, lpt)
        off_q = 0
        if cutlass.const_expr(self.varlen):
            off_q, _, seqlen_q, seqlen_k = varlen.seq_info(vl, batch, seqlen_q, seqlen_k)
            batch = 0
        n_block_min, n_block_max, n_masked_right, n_unmasked = self.kv_split(m_block, seqlen_q, seqlen_k, feat)
        nrow = cute.size(s_mn, mode=[0])
        row_off = m_block * self.tile_m + cwg * ROWS_PER_WG

        # Q stage i belongs to consumer i (the producer fills them in that order).
        q_state = pipeline.PipelineState(self.q_stages, Int32(cwg), Int32(cwg), q_phase)
        pipe_q.consumer_wait(q_state)

        # ---- first KV tile (highest n): always masked (causal or window diagonal, seqlen_k residue)
        n_first = n_block_max - 1
        pipe_k.consumer_wait(k_state)
        self.mma_turn_wait(cwg)
        mma.gemm(qk_mma, acc_S, tSrQ_wg, tSrK[None, None, None, k_state.index], zero_init=True)
        warpgroup.commit_group()
        self.mma_turn_pass(cwg)
        warpgroup.wait_group(0)
        pipe_k.consumer_release(k_state)
        k_state.advance()
        self.scores_before_turn(s_mn, tScS, row_off, n_first, seqlen_q, seqlen_k, feat, True)
        self.exp_turn_wait(cwg)
        self.scores_in_turn(s_mn, tScS, row_off, n_first, seqlen_q, seqlen_k, feat, True)
        softmax.softmax_first(s_mn, row_max, row_sum, scale_log2, self.emulated)
        self.exp_turn_pass(cwg)
        self.make_p(acc_S, p_out, cwg)
        acc_O.fill(0.0)

        # Masked tiles first (n descending reaches the diagonal first), then the unmasked ones,
        # then (a left window) the masked ones at its far edge.
        for i in cutlass.range(1, 1 + n_masked_right, unroll=1):
            k_state, v_state = self.step(
                qk_mma, pv_mma, acc_S, acc_O, tOA, p_out, tSrQ_wg, tSrK, tOrV, tScS, s_mn, o_mn,
                row_max, row_sum, row_scale, pipe_k, pipe_v, k_state, v_state, cwg,
                n_first - i, row_off, seqlen_q, seqlen_k, scale_log2, tau, feat, True,
            )
        for i in cutlass.range(1 + n_masked_right, 1 + n_masked_right + n_unmasked, unroll=1):
            k_state, v_state = self.step(
                qk_mma, pv_mma, acc_S, acc_O, tOA, p_out, tSrQ_wg, tSrK, tOrV, tScS, s_mn, o_mn,
                row_max, row_sum, row_scale, pipe_k, pipe_v, k_state, v_state, cwg,
                n_first - i, row_off, seqlen_q, seqlen_k, scale_log2, tau, feat, False,
            )
        if cutlass.const_expr(self.has_window_left):
            for i in cutlass.range(1 + n_masked_right + n_unmasked, n_block_max - n_block_min, unroll=1):
                k_state, v_state = self.step(
                    qk_mma, pv_mma, acc_S, acc_O, tOA, p_out, tSrQ_wg, tSrK, tOrV, tScS, s_mn, o_mn,
                    row_max, row_sum, row_scale, pipe_k, pipe_v, k_state, v_state, cwg,
                    n_first - i, row_off, seqlen_q, seqlen_k, scale_log2, tau, feat, True,
                )
        # The last PV (with overlap it takes its ping-pong turn like every GEMM issue).
        pipe_v.consumer_wait(v_state)
        if cutlass.const_expr(self.overlap):
            self.mma_turn_wait(cwg)
        mma.gemm(pv_mma, acc_O, tOA, tOrV[None, None, None, v_state.index], zero_init=False)
        warpgroup.commit_group()
        if cutlass.const_expr(self.overlap):
            self.mma_turn_pass(cwg)
        warpgroup.wait_group(0)
        pipe_v.consumer_release(v_state)
        v_state.advance()

        # ---- epilogue
        lse = cute.make_rmem_tensor((nrow,), Float32)
        sink_log2 = None
        if cutlass.const_expr(self.has_sink):
            sink_log2 = mSink[head] * Float32(LOG2_E)
        softmax.finalize(o_mn, row_max, row_sum, lse, scale_log2, sink_log2)
        if cutlass.const_expr(self.has_lse):
            # Each row lives in the 4 threads of a quad; the first one writes it.
            if ctid % 4 == 0:
                for r in cutlass.range_constexpr(nrow):
                    row = row_off + tScS[1] + tScS[0][r, 0][0]
                    if row < seqlen_q:
                        mLSE[off_q + row, head, batch] = lse[r]
        sO_wg = sO[None, None, cwg]  # this consumer's Q buffer, free now that its GEMMs retired
        tOsO = pv_thr.partition_C(sO_wg)
        rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        cute.autovec_copy(rO, tOsO)
        # Make the generic-proxy smem writes visible to the TMA (async proxy) engine.
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=BAR_EPILOGUE + cwg, number_of_threads=THREADS_PER_WG)
        if cutlass.const_expr(self.varlen):
            if row_off + ROWS_PER_WG <= seqlen_q:
                self.store_o_tma(tma_o, cute.domain_offset((off_q, 0, 0, 0), mO), sO, ctid, head, 0, m_block, cwg)
            else:
                # The sequence ends inside these 64 rows: a TMA box would write into the next one.
                varlen.store_rows(rO, pv_thr, vl[5], off_q + row_off, seqlen_q - row_off, head,
                                  (ROWS_PER_WG, self.head_dim_v))
        else:
            self.store_o_tma(tma_o, mO, sO, ctid, head, batch, m_block, cwg)
        if cutlass.const_expr(self.persistent):
            # The whole warpgroup learns that the store has read the buffer, then hands the Q
            # stage back to the producer (one arrive per warp).
            cute.arch.barrier(barrier_id=BAR_EPILOGUE + cwg, number_of_threads=THREADS_PER_WG)
            pipe_q.consumer_release(q_state)
        return k_state, v_state

    # ---------------------------------------------------------------- steps
    @cute.jit
    def step_overlap(
        self, qk_mma, pv_mma, acc_S, acc_O, tOA, p_out, tSrQ_wg, tSrK, tOrV, tScS, s_mn, o_mn,
        row_max, row_sum, row_scale, pipe_k, pipe_v, k_state, v_state, cwg,
        n, row_off, seqlen_q, seqlen_k, scale_log2, tau, feat, masked: cutlass.Constexpr,
    ):
        """Issue QK(n) and PV(previous) back to back; softmax of S(n) runs under PV."""
        pipe_k.consumer_wait(k_state)
        self.mma_turn_wait(cwg)
        mma.gemm(qk_mma, acc_S, tSrQ_wg, tSrK[None, None, None, k_state.index], zero_init=True)
        # Two commit groups, so that wait_group(1) below retires S(n) while PV keeps running.
        warpgroup.commit_group()
        pipe_v.consumer_wait(v_state)
        mma.gemm(pv_mma, acc_O, tOA, tOrV[None, None, None, v_state.index], zero_init=False)
        warpgroup.commit_group()
        self.mma_turn_pass(cwg)
        warpgroup.wait_group(1)
        pipe_k.consumer_release(k_state)
        k_state.advance()
        self.scores_before_turn(s_mn, tScS, row_off, n, seqlen_q, seqlen_k, feat, masked)
        self.exp_turn_wait(cwg)
        self.scores_in_turn(s_mn, tScS, row_off, n, seqlen_q, seqlen_k, feat, masked)
        need = softmax.softmax_next(s_mn, row_max, row_sum, row_scale, scale_log2, tau, self.emulated)
        if cutlass.const_expr(self.exp_pin):
            # Before the exp turn is passed and PV(j-1) waited for: ptxas would otherwise sink most
            # exponentials below both (fwd_config.FwdConfigSm90.exp_pin).
            pin_before(seqlen_k, [s_mn[r, c] for r in range(cute.size(s_mn, mode=[0]))
                                  for c in range(cute.size(s_mn, mode=[1]))])
        self.exp_turn_pass(cwg)
        warpgroup.wait_group(0)
        pipe_v.consumer_release(v_state)
        v_state.advance()
        if need:
            softmax.rescale_rows(o_mn, row_scale)
        self.make_p(acc_S, p_out, cwg)
        return k_state, v_state

    @cute.jit
    def step_serial(
        self, qk_mma, pv_mma, acc_S, acc_O, tOA, p_out, tSrQ_wg, tSrK, tOrV, tScS, s_mn, o_mn,
        row_max, row_sum, row_scale, pipe_k, pipe_v, k_state, v_state, cwg,
        n, row_off, seqlen_q, seqlen_k, scale_log2, tau, feat, masked: cutlass.Constexpr,
    ):
        """PV(previous) to completion, then QK(n) to completion, then softmax(n)."""
        pipe_v.consumer_wait(v_state)
        mma.gemm(pv_mma, acc_O, tOA, tOrV[None, None, None, v_state.index], zero_init=False)
        warpgroup.commit_group()
        pipe_k.consumer_wait(k_state)
        self.mma_turn_wait(cwg)
        mma.gemm(qk_mma, acc_S, tSrQ_wg, tSrK[None, None, None, k_state.index], zero_init=True)
        warpgroup.commit_group()
        self.mma_turn_pass(cwg)
        warpgroup.wait_group(0)
        pipe_v.consumer_release(v_state)
        v_state.advance()
        pipe_k.consumer_release(k_state)
        k_state.advance()
        self.scores_before_turn(s_mn, tScS, row_off, n, seqlen_q, seqlen_k, feat, masked)
        self.scores_in_turn(s_mn, tScS, row_off, n, seqlen_q, seqlen_k, feat, masked)
        need = softmax.softmax_next(s_mn, row_max, row_sum, row_scale, scale_log2, tau, self.emulated)
        if need:
            softmax.rescale_rows(o_mn, row_scale)
        self.make_p(acc_S, p_out, cwg)
        return k_state, v_state

    # ---------------------------------------------------------------- helpers
    @cute.jit
    def store_o_tma(self, tma_o, mO, sO, ctid, head, batch, m_block, cwg):
        """The TMA store of this consumer's staged 64-row O tile (one thread of its first warp)."""
        if ctid < 32:
            tOsO_tma, tOgO = seq_tiles(tma_o, mO, sO, (ROWS_PER_WG, self.head_dim_v), head, batch)
            cute.copy(tma_o, tOsO_tma[None, cwg], tOgO[None, m_block * self.num_wg + cwg])
            cute.arch.cp_async_bulk_commit_group()
            # The CTA must not retire (nor, persistent, the producer refill this buffer with the
            # next tile's Q) before the bulk store has read shared memory.
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def mask(self, s_mn, tScS, row_off, n, seqlen_q, seqlen_k, feat):
        masking.apply_mask(
            s_mn, tScS[0], row_off + tScS[1], n * self.tile_n + tScS[2], seqlen_q, seqlen_k, self.causal,
            self.has_window_left, self.has_window_right, feat[0], feat[1], self.config.mask_bits,
        )

    @cute.jit
    def scores_before_turn(self, s_mn, tScS, row_off, n, seqlen_q, seqlen_k, feat, masked: cutlass.Constexpr):
        """Without softcap the mask runs before the exp turn, as it always did."""
        if cutlass.const_expr(masked and not self.has_softcap):
            self.mask(s_mn, tScS, row_off, n, seqlen_q, seqlen_k, feat)

    @cute.jit
    def scores_in_turn(self, s_mn, tScS, row_off, n, seqlen_q, seqlen_k, feat, masked: cutlass.Constexpr):
        """With softcap: t = tanh(s scale / c) inside the exp turn (MUFU work, like the exp2), then the
        mask (after the cap: tanh(-inf) would be -1, not -inf)."""
        if cutlass.const_expr(self.has_softcap):
            softcap.softcap_scores(s_mn, feat[2], self.tanh_fma)
            if cutlass.const_expr(masked):
                self.mask(s_mn, tScS, row_off, n, seqlen_q, seqlen_k, feat)

    @cute.jit
    def make_p(self, acc_S, p_out, cwg):
        """P = S in 16 bits, where the next PV reads it. Called only after the previous PV of this
        warpgroup has completed (its wait_group(0)), so the shared copy is free to overwrite."""
        tOrP_as_S, tPsP = p_out
        convert.to_packed16(acc_S, tOrP_as_S)
        if cutlass.const_expr(self.p_smem):
            cute.autovec_copy(tOrP_as_S, tPsP)
            # Generic-proxy stores, read by the WGMMA through the async proxy; the whole
            # warpgroup's tile must be there before any of its warps issues the PV.
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=BAR_P + cwg, number_of_threads=THREADS_PER_WG)

    @cute.jit
    def next_wg(self, cwg):
        nxt = cwg + 1
        if nxt == self.num_wg:
            nxt = 0
        return nxt

    @cute.jit
    def mma_turn_wait(self, cwg):
        if cutlass.const_expr(self.pingpong_mma):
            cute.arch.barrier(barrier_id=BAR_MMA_TURN + cwg, number_of_threads=2 * THREADS_PER_WG)

    @cute.jit
    def mma_turn_pass(self, cwg):
        if cutlass.const_expr(self.pingpong_mma):
            cute.arch.barrier_arrive(barrier_id=BAR_MMA_TURN + self.next_wg(cwg), number_of_threads=2 * THREADS_PER_WG)

    @cute.jit
    def exp_turn_wait(self, cwg):
        if cutlass.const_expr(self.pingpong_exp):
            cute.arch.barrier(barrier_id=BAR_EXP_TURN + cwg, number_of_threads=2 * THREADS_PER_WG)

    @cute.jit
    def exp_turn_pass(self, cwg):
        if cutlass.const_expr(self.pingpong_exp):
            cute.arch.barrier_arrive(barrier_id=BAR_EXP_TURN + self.next_wg(cwg), number_of_threads=2 * THREADS_PER_WG)
