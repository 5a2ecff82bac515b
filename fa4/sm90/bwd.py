"""FlashAttention backward for Hopper (sm_90a): the main kernel.

One CTA per (key tile n, query head, batch), or under GQA with gqa_reduce 'loop' per (key tile
n, K/V head, batch), walking the group's query heads one after the other (head-major, each head's
query tiles in order: fa4.common.bwd_schedule.group_step) with dK/dV accumulating over all of
them; 3 warpgroups, 384 threads:
  * warpgroup 0, producer: warp 0 loads K and V of the tile once, then walks the query tiles
    m of the CTA's range and streams Q[m] + LSE[m] and dO[m] + D[m] through mbarrier rings
    (TMA). Warps 1 and 2 (dq_accum 'bulk') take alternate steps: each adds its staged dQ tile
    into the fp32 accumulator with one cp.reduce.async.bulk and, deterministic, takes and
    passes the tile's turn, so one warp's wait for its reduction to complete overlaps the
    other's next tile.
  * warpgroups 1 and 2, consumers: each owns 64 of the 128 key rows. Per query tile:
        S^T  = K Q^T        (SS WGMMA; keys on M)       P^T  = exp2(S^T*scale*log2e - LSE*log2e)
        dP^T = V dO^T       (SS)                        dS^T = P^T * (dP^T - D)
        dV  += P^T dO       (RS: P^T from the S^T accumulator registers; or SS from a copy)
        dQ   = dS K         (SS: dS^T goes through a double-buffered shared tile, both
                             consumers' halves; each consumer computes half of dQ's columns)
        dK  += dS^T Q       (RS)
    S^T and dP^T are in flight together (exp runs under dP^T); P^T and dS^T are converted to
    16 bits after both pointwise loops; dV runs while dS^T is stored and the consumers meet;
    dQ and dK are issued back to back and dQ is staged for the writer while dK runs.

The dQ accumulator holds each tile in WGMMA fragment order (fa4.sm90.bwd_prepost): staging is
conflict-free 16-byte stores and a tile is one linear bulk add. The preprocess (D =
rowsum(dO * O), LSE * log2e, zeroed accumulator; deterministic, only the query tiles no turn
stores: a tile's first dQ turn stores instead of adding) and the postprocess (dQ * scale -> dtype,
read back through the MMA partition) are in fa4.sm90.bwd_prepost; which query tiles a CTA
visits, in which order, and its deterministic turn are in fa4.common.bwd_schedule (tested on the
host), traced for the kernel by fa4.sm90.bwd_walk.

Registers: the consumers' peak is dK, dV, S^T and dP^T (192 fp32 registers at head_dim 128)
during the pointwise loops. Loop-invariant per-element shared-memory addresses are recomputed
in the loop (fa4.common.regs.opaque), and the tile coordinates for the epilogue are recomputed
from the block index, instead of being held; see bwd_config.consumer_registers.

Issue 18's features (compile-time has_window_left/right, has_softcap, has_sink): a sliding
window limits a CTA's query tiles to fa4.common.masking_range.q_block_range, masks the runs where
either bound cuts the key tile (bwd_schedule.m_block_segments: a third, masked loop for the left
bound) and skips the rest; softcap recomputes t = tanh(S^T scale / c) and takes dS^T = P^T (dP^T -
D)(1 - t^2) from the same t (fa4.common.softcap_bwd); a learnable sink is already in the LSE the
forward returned (its gradient is reduced on the host from D). The LSE's own gradient is in D
(the preprocess).

cluster_exchange (fa4.sm90.bwd_cluster, fa4.common.bwd_pair; dkv_split 'head_dim' only): CTAs of
key tiles 2p, 2p+1 run as a cluster of two, exchange dS through distributed shared memory each
step and each add half of dQ's columns, over both key tiles.

Deterministic mode: before adding its dQ tile, a CTA waits on the tile's int32 semaphore
until it reads the CTA's turn (fa4.common.semaphore), and releases the next turn once its
reduction is performed. Turns follow the launch order so that a waiting CTA only waits for
CTAs launched before it (no deadlock while CTAs wait for free SMs). Under GQA with 'atomic' the
same is done for dK/dV, which are then fp32 accumulators summed over the query heads of a KV
head; with 'loop' dK/dV need none (one CTA owns each tile), and dQ's turns are unchanged: a dQ
tile of query head h still has one contributor per key tile, the CTA of h's K/V head, and a
CTA walking several heads only ever waits for CTAs launched before it.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import tensor_utils
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warp, warpgroup

from fa4.common import bwd_pair, masking, mma, scheduling, softcap_bwd, varlen
from fa4.sm90 import bwd_cluster, bwd_dq, bwd_epilogue, bwd_producer, bwd_qm, bwd_split, bwd_walk
from fa4.common.exp2 import exp2_mufu
from fa4.common.layout import acc_as_rows_cols, lane_share, load_share, shared_stat, transpose_view
from fa4.common.regs import opaque, pin_before
from fa4.sm90.bwd_config import REG_SPLIT, ROWS_PER_WG, SEQ_PAD, THREADS_PER_WG, BwdConfigSm90, dkv_sums
# The named barrier ids live beside the dQ paths (fa4.sm90.bwd_dq).
from fa4.sm90.bwd_dq import BAR_DQ_EMPTY, BAR_DQ_FULL, BAR_DS_FREE, BAR_DS_FULL, BAR_P, NUM_CONSUMER_THREADS
from fa4.sm90.bwd_prepost import dq_frag_layout, dq_frag_view, make_dq_mma

# Row statistics (LSE, D) read into registers before the GEMM waits, per thread and step.
STAT_PREFETCH = 16


class FlashBwdSm90(bwd_producer.ProducerSteps, bwd_walk.WalkSteps, bwd_split.DkvSplitSteps, bwd_epilogue.DkvStores,
                   bwd_dq.DqAccumSteps, bwd_cluster.ClusterSteps, bwd_qm.QmSteps):
    def __init__(self, dtype, head_dim: int, causal: bool, gqa: bool, deterministic: bool, config: BwdConfigSm90,
                 head_dim_v: int | None = None, has_window_left: bool = False, has_window_right: bool = False,
                 has_softcap: bool = False, has_sink: bool = False, varlen: bool = False):
        self.dtype = dtype
        # Packed variable-length sequences (compile-time): the packed tensors come as a batch of
        # one, a CTA is (key tile, head, sequence) and reads its sequence's offsets and lengths
        # (fa4.common.varlen); the fp32 side buffers give each sequence whole padded tiles.
        self.varlen = varlen
        # The compact varlen grid (knob varlen_grid): no CTA for the key tiles a sequence lacks.
        self.compact = varlen and config.varlen_grid == "compact"
        # Issue 18's features. Sliding window: the bounds of fa4.common.masking_range (causal is
        # right = 0; the host folds a window right bound into it). Softcap: t = tanh recomputed on
        # S^T, dS^T = P^T (dP^T - D)(1 - t^2) (fa4.common.softcap_bwd). A learnable sink needs
        # nothing here: the forward's LSE includes it, so P is right, and its gradient is a
        # reduction of the preprocess's D on the host (fa4.sm90.bwd_launch).
        self.has_window_left = has_window_left
        self.has_window_right = has_window_right and not causal
        self.has_softcap = has_softcap
        self.has_sink = has_sink
        self.head_dim = head_dim  # Q, K, dQ, dK
        self.head_dim_v = head_dim_v or head_dim  # V, O, dO, dV
        # dkv_split 'head_dim' (fa4.sm90.bwd_split): both consumers on one 64-row key tile, each
        # with half the queries of S^T/dP^T and half the columns of dK/dV; P^T and dS^T meet in
        # shared memory.
        self.split = config.dkv_split == "head_dim"
        # cluster_exchange (fa4.common.bwd_pair, fa4.sm90.bwd_cluster): CTAs of key tiles 2p, 2p+1
        # as a cluster of two, dS exchanged, each adding half of dQ's columns over both tiles.
        self.cluster = config.cluster_exchange
        self.dq_cols = head_dim // 2 if self.cluster else head_dim
        self.causal = causal
        self.gqa = gqa
        self.config = config
        self.tile_m = config.tile_m
        self.tile_n = config.tile_n
        # Q and dO tiles of one query tile travel together: one ring depth, one pipeline state
        # (qm_tile_n with do_single: dO one slot, its own state).
        self.q_stages = config.stages
        self.do_stages = config.do_stages
        # qm_tile_n (fa4.sm90.bwd_qm): S with the queries on M, dK^T/dV^T with the head dim on M.
        self.qm = config.qm_tile_n > 0
        self.deterministic = deterministic
        self.red_v2 = config.dq_accum == "red_v2"
        # 'bulk': consumers stage dQ in shared memory and a producer-side warp reduces it into
        # global memory with one cp.reduce.async.bulk (and owns the semaphore wait), so the
        # MMA warpgroups never spin on a lock.
        self.dq_bulk = config.dq_accum == "bulk"
        self.p_smem = config.dv_operand == "smem" or self.split
        self.ds_stages = config.ds_stages
        self.ds_stmatrix = config.ds_store == "stmatrix"
        self.ds_early = config.ds_early
        self.exp_pin = config.exp_pin
        # dkv_split 'head_dim' step orders (fa4.sm90.bwd_split): dP^T (and dO's load) ahead of S^T
        # (Q's), dK ahead of dQ: Q needed as late and freed as early as the step allows.
        self.dp_first = config.dp_first
        self.dk_before_dq = config.dk_before_dq
        # q_starts: each CTA's run of unmasked query tiles begins at a shifted tile (fa4.common.
        # bwd_schedule.walk_tile), the producer, the dQ writers and the consumers alike.
        self.q_starts = config.q_starts
        if self.q_starts != 1 and deterministic:
            raise ValueError("q_starts shifts non-deterministic walks only (bwd_config.violations)")
        # walk_down (causal, windowed): each CTA walks its query tiles from the last down, the same
        # mirror (bwd_schedule.walk_down_tile) for every role; the dQ turns stay the launch order's.
        self.walk_down = config.walk_down
        if self.walk_down and self.q_starts != 1:
            raise ValueError("walk_down and q_starts both order the walk (bwd_config.violations)")
        # gqa_reduce 'loop': one CTA per (key tile, K/V head, batch) walks the group's query heads
        # and stores dK/dV once, like a kernel without GQA; 'atomic' adds fp32 tiles per query head.
        self.gqa_loop = gqa and config.gqa_reduce == "loop"
        sums = dkv_sums(config, gqa)  # how dK/dV leave: the launch path's answer too (they must agree)
        self.gqa_atomic = sums != "store"
        self.dkv_tma = config.dkv_store == "tma" and not self.gqa_atomic
        # gqa_finish 'last_cta': the first CTA of a group stores its fp32 dK/dV tile, the last
        # writes the output (fa4.sm90.bwd_epilogue): no zeroed accumulators, no dK/dV postprocess.
        self.gqa_last = sums == "last_cta"
        # gqa_add 'bulk': the postprocess path's adds leave through shared memory, one bulk reduction a tile.
        self.gqa_bulk = sums == "bulk"
        # GQA dK/dV reductions (once per CTA): paired unless the scalar path is asked for (qm_tile_n:
        # a thread's adjacent dK^T values are adjacent keys, rows apart in the accumulator).
        self.kv_v2 = config.dq_accum != "red" and not self.qm
        self.num_threads = THREADS_PER_WG * 3
        self.regs_consumer, self.regs_producer = REG_SPLIT

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # (batch, seqlen_q, heads_q, d)
        mK: cute.Tensor,  # (batch, seqlen_k, heads_kv, d)
        mV: cute.Tensor,  # (batch, seqlen_k, heads_kv, dv)
        mdO: cute.Tensor,  # (batch, seqlen_q, heads_q, dv)
        mLSE2: cute.Tensor,  # (batch, heads_q, seqlen_q_pad) fp32: LSE * log2(e), +inf where no key
        mDsum: cute.Tensor,  # (batch, heads_q, seqlen_q_pad) fp32: rowsum(dO * O)
        mdQacc: cute.Tensor,  # (batch, heads_q, seqlen_q_pad, d) fp32, zeroed (deterministic: where no turn stores)
        mdK: cute.Tensor,  # gqa 'atomic': (batch, heads_kv, seqlen_k_pad, d) fp32 (zeroed unless 'last_cta'); else like mK
        mdV: cute.Tensor,  # as mdK, dv wide
        mSemQ: cute.Tensor,  # (batch, heads_q, num_m) int32 zeroed, or None
        mSemKV: cute.Tensor,  # (batch, heads_kv, num_n) int32 zeroed, or None
        mdKout: cute.Tensor,  # gqa_finish 'last_cta': dK like mK, written by a group's last CTA; else None
        mdVout: cute.Tensor,  # ... and dV like mV
        mCuSeqlensQ: cute.Tensor,  # varlen: (B+1,) int32 row offsets of the sequences in q, else None
        mCuSeqlensK: cute.Tensor,  # varlen: (B+1,) int32 in k/v, else None
        mSeqUsedQ: cute.Tensor,  # varlen: (B,) int32 rows used per sequence, or None
        mSeqUsedK: cute.Tensor,  # varlen: (B,) int32 keys used per sequence, or None
        scale_log2: Float32,  # softmax_scale * log2(e)
        scale: Float32,  # softmax_scale
        window_left: Int32,  # has_window_left: keys j >= i + seqlen_k - seqlen_q - window_left
        window_right: Int32,  # has_window_right: keys j <= i + seqlen_k - seqlen_q + window_right
        softcap_inv: Float32,  # has_softcap: softmax_scale / softcap
        softcap_log2: Float32,  # has_softcap: softcap * log2(e)
        max_seqlen_k: Int32,  # varlen: the longest sequence's keys (the grid's key-tile extent); else unused
        # The runtime knobs, in their declaration order (fa4.knobs.runtime_args).
        spt: Int32,
        head_swizzle: Int32,
        stream: cuda.CUstream,
    ):
        # Sequence first, then head_dim, heads, batch: a tile is a plain 2-D TMA box.
        mQ = cute.make_tensor(mQ.iterator, cute.select(mQ.layout, mode=[1, 3, 2, 0]))
        mK = cute.make_tensor(mK.iterator, cute.select(mK.layout, mode=[1, 3, 2, 0]))
        mV = cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[1, 3, 2, 0]))
        mdO = cute.make_tensor(mdO.iterator, cute.select(mdO.layout, mode=[1, 3, 2, 0]))
        d, dv = self.head_dim, self.head_dim_v
        kmaj = cute.nvgpu.OperandMajorMode.K
        mnmaj = cute.nvgpu.OperandMajorMode.MN
        if cutlass.const_expr(self.qm):
            sdp_mma, dkv_mma, dv_mma, dq_mma = bwd_qm.make_mmas(self.dtype, self.tile_m, self.tile_n, d, dv)
        elif cutlass.const_expr(self.split):
            sdp_mma, dkv_mma, dv_mma = bwd_split.make_split_mmas(self.dtype, self.tile_m, d, dv)
        else:
            # S^T = K Q^T and dP^T = V dO^T: keys on M, one 64-row atom per consumer warpgroup.
            sdp_mma = sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, kmaj, kmaj, Float32, (2, 1, 1), (ROWS_PER_WG, self.tile_m)
            )
            # dV += P^T dO and dK += dS^T Q: A from registers, B = dO^T / Q^T (head_dim contiguous).
            dkv_mma = sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, kmaj, mnmaj, Float32, (2, 1, 1), (ROWS_PER_WG, d),
                warpgroup.OperandSource.RMEM,
            )
            # dV with P^T from shared memory (dv_operand 'smem'): P^T stored query-contiguous (K-major).
            dv_mma = self.make_dv_mma(dkv_mma)
        # dQ = dS K: A = dS (query index contiguous, as the S^T accumulator writes it),
        # B = K^T (head_dim contiguous); the two consumers split head_dim or the rows (dq_split).
        if cutlass.const_expr(not self.qm):
            dq_mma = make_dq_mma(self.dtype, self.dq_cols, self.config.dq_split)
        sdp_tiler = (self.tile_n, self.tile_m, d)
        dpv_tiler = (self.tile_n, self.tile_m, dv)  # dP^T = V dO^T reduces over head_dim_v
        # K, Q and dO are also read MN-major in column slices (dQ's, dK's and dV's WGMMA N per
        # warpgroup): their swizzle atoms must tile those slices (bwd_split.swizzle_width); dK and
        # dV leave through sK and sV in their own slices (dkv_store 'tma').
        if cutlass.const_expr(self.qm):
            sQ_layout, sdO_layout, sK_layout, sV_layout, sdS_layout, sP_layout = bwd_qm.make_layouts(self)
        else:
            halves = 2 if self.split else 1
            dq_n = d if self.config.dq_split == "rows" else self.dq_cols // 2
            sK_layout = bwd_split.k_major_layout("a", sdp_tiler, self.dtype, 1, math.gcd(dq_n, d // halves))
            # sV: dV leaves through it in dV's column slices (dkv_store 'tma').
            sV_layout = bwd_split.k_major_layout("a", dpv_tiler, self.dtype, 1, dv // halves)
            sQ_layout = bwd_split.k_major_layout("b", sdp_tiler, self.dtype, self.q_stages, d // halves)
            sdO_layout = bwd_split.k_major_layout("b", dpv_tiler, self.dtype, self.do_stages, dv // halves)
            sdS_layout = sm90_utils.make_smem_layout_a(
                tensor_utils.LayoutEnum.COL_MAJOR, (self.tile_m, d, self.tile_n), self.dtype, self.ds_stages
            )
            # P^T (keys x queries, queries contiguous): one buffer per dS buffer under dkv_split 'head_dim'.
            sP_layout = sm90_utils.make_smem_layout_a(
                tensor_utils.LayoutEnum.ROW_MAJOR, (self.tile_n, d, self.tile_m), self.dtype, self.ds_stages if self.split else 1
            )
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, mQ_tma = cpasync.make_tiled_tma_atom(g2s, mQ, cute.slice_(sQ_layout, (None, None, 0)), (self.tile_m, d))
        tma_do, mdO_tma = cpasync.make_tiled_tma_atom(
            g2s, mdO, cute.slice_(sdO_layout, (None, None, 0)), (self.tile_m, dv)
        )
        tma_k, mK_tma = cpasync.make_tiled_tma_atom(g2s, mK, cute.slice_(sK_layout, (None, None, 0)), (self.tile_n, d))
        tma_v, mV_tma = cpasync.make_tiled_tma_atom(g2s, mV, cute.slice_(sV_layout, (None, None, 0)), (self.tile_n, dv))
        # Row statistics ride with Q (LSE) and dO (D) on the same mbarrier: one fp32 per query row.
        mLSE2 = cute.make_tensor(mLSE2.iterator, cute.select(mLSE2.layout, mode=[2, 1, 0]))
        mDsum = cute.make_tensor(mDsum.iterator, cute.select(mDsum.layout, mode=[2, 1, 0]))
        sStat_layout = cute.make_layout((self.tile_m, self.q_stages))
        sDsum_layout = cute.make_layout((self.tile_m, self.do_stages))
        tma_lse, mLSE2_tma = cpasync.make_tiled_tma_atom(g2s, mLSE2, cute.make_layout(self.tile_m), (self.tile_m,))
        tma_dsum, mDsum_tma = cpasync.make_tiled_tma_atom(g2s, mDsum, cute.make_layout(self.tile_m), (self.tile_m,))
        stat_bytes = self.tile_m * 4
        self.q_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sQ_layout, (None, None, 0))) + stat_bytes
        self.do_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sdO_layout, (None, None, 0))) + stat_bytes
        self.kv_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sK_layout, (None, None, 0))) + cute.size_in_bytes(
            self.dtype, cute.slice_(sV_layout, (None, None, 0))
        )
        # cluster_exchange: the peer's K tile in this CTA's dQ columns rides on the K/V barrier.
        sKp_layout = bwd_cluster.peer_k_layout(self, sdp_tiler) if self.cluster else sK_layout
        tma_kp, mKp_tma = None, None
        if cutlass.const_expr(self.cluster):
            tma_kp, mKp_tma = cpasync.make_tiled_tma_atom(
                g2s, mK, cute.slice_(sKp_layout, (None, None, 0)), (self.tile_n, self.dq_cols)
            )
            self.kv_bytes += cute.size_in_bytes(self.dtype, cute.slice_(sKp_layout, (None, None, 0)))

        @cute.struct
        class SharedStorage:
            mbar_kv: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_q: cute.struct.MemRange[cutlass.Int64, self.q_stages * 2]
            mbar_do: cute.struct.MemRange[cutlass.Int64, self.do_stages * 2]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sdO_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sdS_layout)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sP_layout) if self.p_smem else 8], 1024]
            sdQ: cute.struct.Align[cute.struct.MemRange[Float32, self.tile_m * self.dq_cols if self.dq_bulk else 1], 128]
            sLSE: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sStat_layout)], 128]
            sDsum: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sDsum_layout)], 128]

        self.shared_storage = SharedStorage
        # cluster_exchange: a second struct, so that the kernels without it keep their layout.
        self.cluster_storage = bwd_cluster.cluster_storage(self, sKp_layout, sdS_layout) if self.cluster else None

        tma_dk = tma_dv = None
        # Varlen with dkv_store 'tma': a sequence's last, partial key tile leaves by predicated
        # stores from these (a TMA box would write into the next sequence's rows).
        mdK_rows = mdV_rows = None
        if cutlass.const_expr(self.dkv_tma and self.varlen):
            mdK_rows, mdV_rows = mdK, mdV
        # gqa_finish 'last_cta' (never with dkv_store 'tma', which GQA 'atomic' does not take): the
        # outputs ride in the same slots to the epilogue.
        if cutlass.const_expr(self.gqa_last):
            mdK_rows, mdV_rows = mdKout, mdVout
        if cutlass.const_expr(self.dkv_tma):
            # dK/dV leave from the K/V shared tiles (same shape, same swizzle) as TMA stores; the
            # store clips the rows past seqlen_k.
            s2g = cpasync.CopyBulkTensorTileS2GOp()
            mdK = cute.make_tensor(mdK.iterator, cute.select(mdK.layout, mode=[1, 3, 2, 0]))
            mdV = cute.make_tensor(mdV.iterator, cute.select(mdV.layout, mode=[1, 3, 2, 0]))
            tma_dk, mdK = cpasync.make_tiled_tma_atom(s2g, mdK, cute.slice_(sK_layout, (None, None, 0)), (self.tile_n, d))
            tma_dv, mdV = cpasync.make_tiled_tma_atom(s2g, mdV, cute.slice_(sV_layout, (None, None, 0)), (self.tile_n, dv))

        num_heads = mQ.shape[2]
        vl = None
        if cutlass.const_expr(self.varlen):
            vl = (mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK, max_seqlen_k)
        # One CTA per (key tile, head, batch): query heads, or K/V heads with gqa_reduce 'loop' (never
        # with varlen: violations() refuses the pair).
        num_n, num_bh = scheduling.tile_grid(mK.shape[0], self.tile_n, mK.shape[2] if self.gqa_loop else num_heads,
                                             mQ.shape[3], vl)
        num_ctas = num_n * num_bh
        if cutlass.const_expr(self.compact):
            # (total_k // tile_n + sequences) tiles a head cover every sequence's region
            # (fa4.common.varlen.tile_start); the heads take the place of heads x sequences.
            num_ctas = varlen.compact_tiles(mK.shape[0], mCuSeqlensQ.shape[0] - 1, self.tile_n) * num_heads
        args = (
            sdp_mma, dkv_mma, dv_mma, dq_mma, tma_q, mQ_tma, tma_do, mdO_tma, tma_k, mK_tma, tma_v, mV_tma,
            tma_lse, mLSE2_tma, tma_dsum, mDsum_tma, mdQacc, mdK, mdV, tma_dk, tma_dv, mSemQ, mSemKV,
            sQ_layout, sdO_layout, sK_layout, sV_layout, sdS_layout, sP_layout, sStat_layout, sDsum_layout,
            scale_log2, scale, window_left, window_right, softcap_inv, softcap_log2, head_swizzle, spt,
            mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK, max_seqlen_k, mdK_rows, mdV_rows,
            tma_kp, mKp_tma, sKp_layout,
        )
        if cutlass.const_expr(self.cluster):
            # Whole pairs: the odd tail's second CTA owns no key (fa4.common.bwd_pair).
            grid = (bwd_pair.num_pairs(num_n) * bwd_pair.PAIR * num_bh, 1, 1)
            self.kernel(*args).launch(grid=grid, block=[self.num_threads, 1, 1], cluster=[bwd_pair.PAIR, 1, 1],
                                      stream=stream, min_blocks_per_mp=1)
        else:
            # No cluster launch attribute at all: the kernels without the exchange launch as before.
            self.kernel(*args).launch(grid=(num_ctas, 1, 1), block=[self.num_threads, 1, 1], stream=stream,
                                      min_blocks_per_mp=1)

    def make_dv_mma(self, dkv_mma):
        if not self.p_smem and self.head_dim_v == self.head_dim:
            return dkv_mma
        if not self.p_smem:
            kmaj, mnmaj = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
            return sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, kmaj, mnmaj, Float32, (2, 1, 1), (ROWS_PER_WG, self.head_dim_v),
                warpgroup.OperandSource.RMEM,
            )
        kmaj, mnmaj = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        return sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, kmaj, mnmaj, Float32, (2, 1, 1), (ROWS_PER_WG, self.head_dim_v)
        )

    @cute.kernel
    def kernel(
        self,
        sdp_mma: cute.TiledMma,
        dkv_mma: cute.TiledMma,
        dv_mma: cute.TiledMma,
        dq_mma: cute.TiledMma,
        tma_q: cute.CopyAtom,
        mQ: cute.Tensor,  # (seqlen_q, d, heads_q, batch), TMA view
        tma_do: cute.CopyAtom,
        mdO: cute.Tensor,
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,  # (seqlen_k, d, heads_kv, batch), TMA view
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,
        tma_lse: cute.CopyAtom,
        mLSE2: cute.Tensor,  # (seqlen_q_pad, heads_q, batch), TMA view
        tma_dsum: cute.CopyAtom,
        mDsum: cute.Tensor,
        mdQacc: cute.Tensor,
        mdK: cute.Tensor,  # dkv_store 'tma': (seqlen_k, d, heads_kv, batch), TMA view
        mdV: cute.Tensor,
        tma_dk: cute.CopyAtom,  # None unless dkv_store 'tma'
        tma_dv: cute.CopyAtom,
        mSemQ: cute.Tensor,
        mSemKV: cute.Tensor,
        sQ_layout: cute.ComposedLayout,
        sdO_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sdS_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        sStat_layout: cute.Layout,
        sDsum_layout: cute.Layout,
        scale_log2: Float32,
        scale: Float32,
        window_left: Int32,
        window_right: Int32,
        softcap_inv: Float32,
        softcap_log2: Float32,
        head_swizzle: Int32,
        spt: Int32,
        mCuSeqlensQ: cute.Tensor,
        mCuSeqlensK: cute.Tensor,
        mSeqUsedQ: cute.Tensor,
        mSeqUsedK: cute.Tensor,
        max_seqlen_k: Int32,
        mdK_rows: cute.Tensor,  # varlen with dkv_store 'tma': mdK as given (the partial tiles' stores);
        # gqa_finish 'last_cta': the dK output (mdK is the fp32 sum); else None
        mdV_rows: cute.Tensor,
        tma_kp: cute.CopyAtom,  # cluster_exchange: the peer's K columns (else None)
        mKp: cute.Tensor,
        sKp_layout: cute.ComposedLayout,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        win = (window_left, window_right)
        vl = None
        if cutlass.const_expr(self.varlen):
            vl = (mCuSeqlensQ, mCuSeqlensK, mSeqUsedQ, mSeqUsedK, max_seqlen_k)
        bidx, _, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // THREADS_PER_WG)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # (m, d, stages)
        sdO = storage.sdO.get_tensor(sdO_layout.outer, swizzle=sdO_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)  # (n, d, 1)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sdS = storage.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)  # (m, n, ds_stages)
        sP = sdS  # placeholder: only read when dv_operand is 'smem'
        if cutlass.const_expr(self.p_smem):
            sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)  # (n, m, 1)
        sLSE = storage.sLSE.get_tensor(sStat_layout)  # (m, q_stages)
        sDsum = storage.sDsum.get_tensor(sDsum_layout)  # (m, do_stages)
        # fp32 dQ tile in fragment order ((4, F/4), (thread, warpgroup)): the byte order of the tile
        # in the accumulator too, so one linear bulk reduction adds it (fa4.sm90.bwd_prepost).
        # (cluster_exchange: this CTA's half of the columns, a tile of its own in the same order.)
        sdQ = cute.make_tensor(storage.sdQ.data_ptr(), dq_frag_layout(self.tile_m, self.dq_cols))
        cluster_smem = None
        if cutlass.const_expr(self.cluster):
            cstore = smem.allocate(self.cluster_storage)
            sKp = cstore.sKp.get_tensor(sKp_layout.outer, swizzle=sKp_layout.inner)  # (n, d/2, 1)
            sdSp = cstore.sdSp.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)  # (m, n, ds_stages)
            mbar_x = cstore.mbar_x.data_ptr()
            bwd_cluster.init_barriers(self.ds_stages, mbar_x, tidx)
            cluster_smem = (tma_kp, mKp, sKp, sdSp, mbar_x)

        producer_group = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, NUM_CONSUMER_THREADS // 32)
        pipe_kv = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_kv.data_ptr(), num_stages=1, producer_group=producer_group,
            consumer_group=consumers, tx_count=self.kv_bytes, defer_sync=True,
        )
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=self.q_stages, producer_group=producer_group,
            consumer_group=consumers, tx_count=self.q_bytes, defer_sync=True,
        )
        pipe_do = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_do.data_ptr(), num_stages=self.do_stages, producer_group=producer_group,
            consumer_group=consumers, tx_count=self.do_bytes, defer_sync=True,
        )
        cute.arch.mbarrier_init_fence()
        if cutlass.const_expr(self.cluster):
            # The peer's barriers must be initialised before this CTA's first remote arrive/copy.
            cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()

        roles = (
            sdp_mma, dkv_mma, dv_mma, dq_mma, tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, tma_lse, mLSE2,
            tma_dsum, mDsum, mdQacc, mdK, mdV, (tma_dk, tma_dv, mdK_rows, mdV_rows), mSemQ, mSemKV,
            sQ, sdO, sK, sV, sdS, sP, sLSE, sDsum, sdQ, pipe_kv, pipe_q, pipe_do, tidx, bidx, warp_idx, wg_idx,
            scale_log2, scale, win, softcap_inv, softcap_log2, head_swizzle, spt, vl, cluster_smem,
        )
        if cutlass.const_expr(self.varlen):
            # A key tile past its sequence's keys (a shorter sequence than the longest, or an empty
            # one) exits here, every thread of the CTA alike: no load, no GEMM, no store, no turn.
            n_block, _, _, _, _, _, _, _, _, _, seq = self.tile_coords(bidx, mQ, mK, head_swizzle, spt, win, vl)
            if n_block * self.tile_n < seq[3]:
                self.roles(*roles)
        else:
            self.roles(*roles)
        if cutlass.const_expr(self.cluster):
            # No CTA leaves while its peer may still copy into it or arrive on its barriers.
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    @cute.jit
    def roles(
        self, sdp_mma, dkv_mma, dv_mma, dq_mma, tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, tma_lse, mLSE2,
        tma_dsum, mDsum, mdQacc, mdK, mdV, tma_dkv, mSemQ, mSemKV,
        sQ, sdO, sK, sV, sdS, sP, sLSE, sDsum, sdQ, pipe_kv, pipe_q, pipe_do, tidx, bidx, warp_idx, wg_idx,
        scale_log2, scale, win, softcap_inv, softcap_log2, head_swizzle, spt, vl, cluster_smem,
    ):
        """The warp roles of the CTA: the producer warp's loads, the dQ writer warps, the consumers."""
        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.regs_producer)
            # Tile coordinates are derived after the register split in each branch, so that
            # nothing computed before it stays live into the register-bound consumers.
            n_block, head, head_kv, batch, qhead_per_kvhead, num_n, m_start, m_masked_end, m_unmasked_end, m_end, seq = (
                self.tile_coords(bidx, mQ, mK, head_swizzle, spt, win, vl)
            )
            seqlen_q, seqlen_k = seq[2], seq[3]
            run = self.walk_span((m_start, m_masked_end, m_unmasked_end, m_end))
            if warp_idx == 0:
                self.producer(
                    tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, tma_lse, mLSE2, tma_dsum, mDsum,
                    sQ, sdO, sK, sV, sLSE, sDsum,
                    pipe_kv, pipe_q, pipe_do, n_block, head, head_kv, batch, m_start, m_end, run,
                    self.heads_walked(qhead_per_kvhead), seq,
                )
            if cutlass.const_expr(self.cluster):
                if warp_idx == 3:
                    self.producer_peer_k(cluster_smem, pipe_kv, n_block, head_kv, batch)
            if cutlass.const_expr(self.dq_bulk):
                # Two writer warps take alternate steps: one waits for its reduction to complete
                # (deterministic turn hand-off) while the other already adds the next tile.
                if warp_idx == 1:
                    self.dq_writer(
                        sdQ, mdQacc, mSemQ, tidx % 32, n_block, head, batch, num_n,
                        m_start, m_end, run, seqlen_q, seqlen_k, spt, win, self.heads_walked(qhead_per_kvhead), seq,
                        0,
                    )
                if warp_idx == 2:
                    self.dq_writer(
                        sdQ, mdQacc, mSemQ, tidx % 32, n_block, head, batch, num_n,
                        m_start, m_end, run, seqlen_q, seqlen_k, spt, win, self.heads_walked(qhead_per_kvhead), seq,
                        1,
                    )
        else:
            cute.arch.setmaxregister_increase(self.regs_consumer)
            ctid = tidx - THREADS_PER_WG
            n_block, head, head_kv, batch, qhead_per_kvhead, num_n, m_start, m_masked_end, m_unmasked_end, m_end, seq = (
                self.tile_coords(bidx, mQ, mK, head_swizzle, spt, win, vl)
            )
            self.consumer(
                sdp_mma, dkv_mma, dv_mma, dq_mma, sLSE, sDsum, mdQacc, mdK, mdV, mSemQ, mSemKV,
                sQ, sdO, sK, sV, sdS, sP, sdQ, pipe_kv, pipe_q, pipe_do, ctid,
                n_block, head, batch, num_n,
                (m_start, m_masked_end, m_unmasked_end, m_end), seq[2], seq[3], scale_log2, scale, spt,
                (bidx, mQ, mK, head_swizzle, vl), tma_dkv, win, (softcap_inv, softcap_log2), seq, cluster_smem,
            )

    def acc_rows(self, mAcc, batch, head, offset):
        """(rows, d) of one (batch, head) of an fp32 side buffer (batch, heads, rows, d); varlen:
        of sequence ``batch`` (packed ``offset``), its padded region (fa4.common.varlen)."""
        if cutlass.const_expr(self.varlen):
            pad = varlen.padded_offset(offset, batch, SEQ_PAD)
            return cute.domain_offset((pad, 0), mAcc[0, head, None, None])
        return mAcc[batch, head, None, None]

    # ---------------------------------------------------------------- consumers
    @cute.jit
    def consumer(
        self, sdp_mma, dkv_mma, dv_mma, dq_mma, sLSE, sDsum, mdQacc, mdK, mdV, mSemQ, mSemKV,
        sQ, sdO, sK, sV, sdS, sP, sdQ, pipe_kv, pipe_q, pipe_do, ctid,
        n_block, head, batch, num_n,
        m_segments, seqlen_q, seqlen_k, scale_log2, scale, spt, coord_args, tma_dkv, win, softcap_args, seq,
        cluster_smem,
    ):
        m_start, m_masked_end, m_unmasked_end, m_end = m_segments
        if cutlass.const_expr(self.qm):
            frag, accs, c0_mn, col0, limits, dkv_thr, dv_out_thr, dq_thr = self.qm_setup(
                sdp_mma, dkv_mma, dv_mma, dq_mma, sQ, sdO, sK, sV, sdS, sP, sdQ, pipe_kv, ctid, n_block
            )
        else:
            frag, accs, c0_mn, col0, limits, dkv_thr, dv_out_thr, dq_thr = self.keys_setup(
                sdp_mma, dkv_mma, dv_mma, dq_mma, sQ, sdO, sK, sV, sdS, sP, sdQ, pipe_kv, ctid, n_block,
                seqlen_q, seqlen_k, win, cluster_smem,
            )
        step = self.step_for_layout()
        acc_dV, acc_dK = accs[2], accs[3]
        # gqa_reduce 'loop': the group's query heads one after the other (fa4.common.bwd_schedule.
        # group_step), dK/dV accumulating across all of them; the step index, and with it the ring
        # slot and the dQ writer's turn, continues from head to head: step() counts m - step_base.
        group = 1
        if cutlass.const_expr(self.gqa_loop):
            group = coord_args[1].shape[2] // coord_args[2].shape[2]
        for hl in cutlass.range(group, unroll=1):
            step_base = m_start
            if cutlass.const_expr(self.gqa_loop):
                step_base = m_start - hl * (m_end - m_start)
            span = self.walk_span(m_segments)
            for first, end, masked in self.walk_segments(m_segments):
                for m in cutlass.range(first, end, unroll=1):
                    # (q_starts: the unmasked run's tiles in a shifted order; walk_down: mirrored.)
                    mq, base = self.walked(m, step_base, span, n_block, masked)
                    step(
                        sdp_mma, dkv_mma, dv_mma, dq_mma, dq_thr, frag, accs, c0_mn, col0, limits, sLSE, sDsum,
                        mdQacc, mSemQ, pipe_q, pipe_do, base, ctid, mq, n_block, head + hl, batch, num_n,
                        seqlen_q, seqlen_k, scale_log2, spt, win, softcap_args, seq, masked,
                    )
        # The tile coordinates again, from the block index: recomputing them here is a few
        # integer ops, holding them through the mainloop cost registers the loop needs.
        bidx, mQ, mK, head_swizzle, vl = coord_args
        n_block, head, head_kv, batch, qhead_per_kvhead, _, _, _, _, _, seq = self.tile_coords(
            opaque(bidx), mQ, mK, head_swizzle, spt, win, vl
        )
        self.epilogue(
            dkv_mma, dkv_thr, acc_dK, acc_dV, mdK, mdV, mSemKV, ctid, n_block, head, head_kv, batch,
            qhead_per_kvhead, seq, scale, sK, sV, tma_dkv, (self.dv_out_mma(dkv_mma, dv_mma), dv_out_thr), sQ,
        )

    @cute.jit
    def keys_setup(self, sdp_mma, dkv_mma, dv_mma, dq_mma, sQ, sdO, sK, sV, sdS, sP, sdQ, pipe_kv, ctid, n_block,
                   seqlen_q, seqlen_k, win, cluster_smem):
        """Fragments, accumulators and the thread's mask limits of the keys-on-M layouts, after K
        and V have landed."""
        d, dv = self.head_dim, self.head_dim_v
        sdp_thr = sdp_mma.get_slice(ctid)
        dkv_thr = dkv_mma.get_slice(ctid)
        dq_thr = dq_mma.get_slice(ctid)
        dv_thr = dv_mma.get_slice(ctid)
        # The shared-memory operands' descriptors are the same for all 128 threads of a warpgroup:
        # sliced at the warpgroup's first thread, an index the compiler knows is warp-uniform,
        # their per-step arithmetic stays in uniform registers. Sliced at ctid it ran in vector
        # registers and every descriptor crossed over with an R2UR before its WGMMA (ncu, hd128
        # causal: 51M R2UR and ~100M more integer instructions than the reference's kernel).
        sdp_wg, dkv_wg, dq_wg, dv_wg = mma.wg_slices(ctid, sdp_mma, dkv_mma, dq_mma, dv_mma)
        tSrK = sdp_wg.make_fragment_A(sdp_wg.partition_A(sK))  # (MMA, 1, d/16, 1)
        tSrQ = sdp_wg.make_fragment_B(sdp_wg.partition_B(sQ))  # (MMA, m/8.., d/16, stages)
        tdPrV = sdp_wg.make_fragment_A(sdp_wg.partition_A(sV))
        tdPrdO = sdp_wg.make_fragment_B(sdp_wg.partition_B(sdO))
        tdVrdOt = dv_wg.make_fragment_B(dv_wg.partition_B(transpose_view(sdO)))  # (MMA, d.., m/16, stages)
        tdKrQt = dkv_wg.make_fragment_B(dkv_wg.partition_B(transpose_view(sQ)))
        tdQrdS = dq_wg.make_fragment_A(dq_wg.partition_A(sdS))  # (MMA, m/64, n/16, 1)
        tdQrKt = dq_wg.make_fragment_B(dq_wg.partition_B(transpose_view(sK)))

        acc_S = sdp_thr.make_fragment_C(sdp_thr.partition_shape_C((self.tile_n, self.tile_m)))
        acc_dP = sdp_thr.make_fragment_C(sdp_thr.partition_shape_C((self.tile_n, self.tile_m)))
        dv_out_thr = self.dv_out_slice(dkv_thr, dv_thr)
        acc_dV = dv_out_thr.make_fragment_C(dv_out_thr.partition_shape_C((self.tile_n, dv)))
        acc_dK = dkv_thr.make_fragment_C(dkv_thr.partition_shape_C((self.tile_n, d)))
        acc_dQ = dq_thr.make_fragment_C(dq_thr.partition_shape_C((self.tile_m, self.dq_cols)))
        tdKsdSt = sdSt = None  # dkv_split 'head_dim': dK's A operand, dS^T in shared memory
        if cutlass.const_expr(self.split):
            # 16-bit copies of the accumulators, for the stores into sP and sdS.
            tdVrP = cute.make_rmem_tensor_like(acc_S, self.dtype)
            tdKrdS = cute.make_rmem_tensor_like(acc_dP, self.dtype)
            tdVA = dv_wg.make_fragment_A(dv_wg.partition_A(sP))  # (MMA, 1, m/16, ds_stages)
            sdSt = transpose_view(sdS)  # (n, m, ds_stages)
            tdKsdSt = dkv_wg.make_fragment_A(dkv_wg.partition_A(sdSt))
        else:
            # The A-operand register order of a 16-bit WGMMA equals the accumulator order of two
            # adjacent 8-column blocks, so P^T and dS^T are the accumulators converted in place.
            tdVrP = cute.make_rmem_tensor(dkv_thr.partition_shape_A((self.tile_n, self.tile_m)), self.dtype)
            tdKrdS = cute.make_rmem_tensor(dkv_thr.partition_shape_A((self.tile_n, self.tile_m)), self.dtype)
        tdVrP_as_S = cute.make_tensor(tdVrP.iterator, acc_S.layout)
        if cutlass.const_expr(not self.split):
            tdVA = tdVrP  # the dV A operand: P^T registers, or its shared-memory copy
            if cutlass.const_expr(self.p_smem):
                tdVA = dv_wg.make_fragment_A(dv_wg.partition_A(sP))[None, None, None, 0]
        tdKrdS_as_S = cute.make_tensor(tdKrdS.iterator, acc_S.layout)
        # Static element offsets of thread 0 (see fa4.common.masking) + this thread's first element.
        cS = cute.make_identity_tensor((self.tile_n, self.tile_m))
        c0_mn = acc_as_rows_cols(sdp_mma.get_slice(0).partition_C(cS))
        row0, col0 = acc_as_rows_cols(sdp_thr.partition_C(cS))[0, 0]
        s_mn = acc_as_rows_cols(acc_S)
        dp_mn = acc_as_rows_cols(acc_dP)
        acc_dV.fill(0.0)
        acc_dK.fill(0.0)

        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipe_kv.consumer_wait(kv_state)
        # Mask limits relative to this thread's first key row, loop-invariant (one register each).
        key_base = n_block * self.tile_n + row0
        key_limit = seqlen_k - key_base
        diag = seqlen_k - seqlen_q - key_base
        # A key row r (relative to key_base) of query q is visible iff diag_lo + q <= r <= diag_hi + q.
        diag_hi = diag
        if cutlass.const_expr(self.has_window_right):
            diag_hi = diag + win[1]
        diag_lo = diag
        if cutlass.const_expr(self.has_window_left):
            diag_lo = diag - win[0]
        limits = (key_limit, diag_hi, diag_lo)
        frag = (tSrK, tSrQ, tdPrV, tdPrdO, tdVrdOt, tdKrQt, tdQrdS, tdQrKt, sdS, sdQ, tdVA, sP, tdKsdSt, sdSt)
        if cutlass.const_expr(self.cluster):
            frag = frag + (bwd_cluster.peer_fragments(dq_wg, cluster_smem, sdS, sK),)
        accs = (acc_S, acc_dP, acc_dV, acc_dK, acc_dQ, tdVrP, tdKrdS, tdVrP_as_S, tdKrdS_as_S, s_mn, dp_mn)
        return frag, accs, c0_mn, col0, limits, dkv_thr, dv_out_thr, dq_thr

    def step_for_layout(self):
        """The mainloop step of this kernel's layout: keys on M, or queries on M (qm_tile_n)."""
        return self.step_qm if self.qm else self.step

    def dv_out_mma(self, dkv_mma, dv_mma):
        """The tiled MMA whose accumulator holds dV: dK's where both have one shape (dkv_split
        'keys', head_dim_v == head_dim, whichever operand P^T comes from), else dV's own."""
        if self.split or self.head_dim_v != self.head_dim:
            return dv_mma
        return dkv_mma

    def dv_out_slice(self, dkv_thr, dv_thr):
        if self.split or self.head_dim_v != self.head_dim:
            return dv_thr
        return dkv_thr

    @cute.jit
    def step(
        self, sdp_mma, dkv_mma, dv_mma, dq_mma, dq_thr, frag, accs, c0_mn, col0, limits, sLSE, sDsum, mdQacc,
        mSemQ, pipe_q, pipe_do, step_base, ctid, m, n_block, head, batch, num_n,
        seqlen_q, seqlen_k, scale_log2, spt, win, softcap_args, seq, masked: cutlass.Constexpr,
    ):
        tSrK, tSrQ, tdPrV, tdPrdO, tdVrdOt, tdKrQt, tdQrdS, tdQrKt, sdS, sdQ, tdVA, sP = frag[:12]
        acc_S, acc_dP, acc_dV, acc_dK, acc_dQ, tdVrP, tdKrdS, tdVrP_as_S, tdKrdS_as_S, s_mn, dp_mn = accs
        nrow = cute.size(s_mn, mode=[0])
        ncol = cute.size(s_mn, mode=[1])
        q_base = m * self.tile_m + col0

        # The ring position follows from the step number: no pipeline state carried across
        # iterations (two fewer live registers in a loop that is at the register limit).
        i = m - step_base
        state = pipeline.PipelineState(self.q_stages, i, i % self.q_stages, (i // self.q_stages) % 2)
        ds_buf = i % self.ds_stages
        dp = (sdp_mma, acc_dP, tdPrV, 0, tdPrdO, state.index)
        if cutlass.const_expr(self.dp_first):
            self.gemm_dp(pipe_do, state, dp)
        pipe_q.consumer_wait(state)
        mma.gemm(sdp_mma, acc_S, tSrK[None, None, None, 0], tSrQ[None, None, None, state.index], zero_init=True)
        warpgroup.commit_group()
        # The row statistics go to registers while the GEMMs run: read inside the pointwise
        # loops, after the wait, their shared-memory latency stalled the first FFMA (the top
        # stall of the consumers in Nsight Compute). LSE rides on Q's mbarrier, D on dO's. Only
        # where a thread's columns fit STAT_PREFETCH registers (tile_m 64): the 32 of tile_m 128
        # spilled, and prefetching 16 of them there lost 8% on the H200 (the registers the
        # pointwise loops need).
        npre = ncol if ncol <= STAT_PREFETCH else 0
        # stat_shuffle: this lane's share of the columns (fa4.common.layout.lane_share), else none.
        # (tile_m 128 with softcap spills: violations() refuses it, so the softcap loop keeps its loads.)
        share = lane_share(c0_mn, ncol) if self.config.stat_shuffle and not self.has_softcap else None
        tLSE = cute.make_rmem_tensor((max(npre, 1),), Float32)
        for c in cutlass.range_constexpr(npre):
            tLSE[c] = sLSE[col0 + c0_mn[0, c][1], state.index]
        if cutlass.const_expr(share is not None):
            tLSE = load_share(sLSE, share, col0, state.index)
        if cutlass.const_expr(not self.dp_first):
            self.gemm_dp(pipe_do, state, dp)
        # S^T done (dp_first: the later of the two, so both).
        warpgroup.wait_group(0 if self.dp_first else 1)
        if cutlass.const_expr(self.has_softcap):
            # t = tanh(S^T * scale / c) runs under the dP^T GEMM (not with dp_first); the mask after
            # it (tanh(-inf) would be -1, a visible score). P and dS^T then come from t in one loop,
            # after dP^T.
            softcap_inv, softcap_log2 = softcap_args
            softcap_bwd.tanh_scores(s_mn, softcap_inv)
            if cutlass.const_expr(masked):
                self.apply_mask_t(s_mn, c0_mn, limits, q_base)
            self.wait_dp(s_mn, seqlen_k)
            # One loop over columns (queries): the LSE registers are still live here, so D is read
            # from shared memory once per column instead of taking 16 more registers.
            for c in cutlass.range_constexpr(ncol):
                lse = tLSE[c] if c < npre else sLSE[col0 + c0_mn[0, c][1], state.index]
                dsum = sDsum[col0 + c0_mn[0, c][1], state.index]
                for r in cutlass.range_constexpr(nrow):
                    t = s_mn[r, c]
                    p = exp2_mufu(t * softcap_log2 - lse)
                    s_mn[r, c] = p
                    dp_mn[r, c] = p * (dp_mn[r, c] - dsum) * softcap_bwd.dtanh(t)
        else:
            if cutlass.const_expr(masked):
                self.apply_mask_t(s_mn, c0_mn, limits, q_base)
            if cutlass.const_expr(share is not None):
                # One shuffle a column, shared by the thread's rows.
                for c in cutlass.range_constexpr(ncol):
                    lse = shared_stat(tLSE, share, c)
                    for r in cutlass.range_constexpr(nrow):
                        s_mn[r, c] = exp2_mufu(s_mn[r, c] * scale_log2 - lse)
                tDsum = load_share(sDsum, share, col0, state.index)
            else:
                for r in cutlass.range_constexpr(nrow):
                    for c in cutlass.range_constexpr(ncol):
                        lse = tLSE[c] if c < npre else sLSE[col0 + c0_mn[0, c][1], state.index]
                        s_mn[r, c] = exp2_mufu(s_mn[r, c] * scale_log2 - lse)
                tDsum = cute.make_rmem_tensor((max(npre, 1),), Float32)
                for c in cutlass.range_constexpr(npre):
                    tDsum[c] = sDsum[col0 + c0_mn[0, c][1], state.index]
            self.wait_dp(s_mn, seqlen_k)
            if cutlass.const_expr(share is not None):
                for c in cutlass.range_constexpr(ncol):
                    dsum = shared_stat(tDsum, share, c)
                    for r in cutlass.range_constexpr(nrow):
                        dp_mn[r, c] = s_mn[r, c] * (dp_mn[r, c] - dsum)
            else:
                for r in cutlass.range_constexpr(nrow):
                    for c in cutlass.range_constexpr(ncol):
                        dsum = tDsum[c] if c < npre else sDsum[col0 + c0_mn[0, c][1], state.index]
                        dp_mn[r, c] = s_mn[r, c] * (dp_mn[r, c] - dsum)
        # Both 16-bit conversions after the pointwise loops: P^T and dS^T are never live beside
        # the fp32 S^T and dP^T (the register budget at head_dim 128).
        if cutlass.const_expr(self.ds_early and not self.split):
            # dS^T first, into shared memory at once: its stores land while P^T is converted
            # and the dV GEMM is issued, before the fence that waits for them.
            tdKrdS_as_S.store(acc_dP.load().to(self.dtype))
            self.store_ds(sdp_mma, tdKrdS_as_S, sdS, ds_buf, ctid)
            tdVrP_as_S.store(acc_S.load().to(self.dtype))
        else:
            tdVrP_as_S.store(acc_S.load().to(self.dtype))
            tdKrdS_as_S.store(acc_dP.load().to(self.dtype))
        if cutlass.const_expr(self.cluster):
            self.cluster_exchange_and_gemms(
                sdp_mma, dkv_mma, dv_mma, dq_mma, frag, accs, state, ds_buf, ctid, i, BAR_DS_FREE, BAR_DS_FULL,
                NUM_CONSUMER_THREADS,
            )
        elif cutlass.const_expr(self.split):
            self.split_exchange_and_gemms(
                sdp_mma, dkv_mma, dv_mma, dq_mma, frag, accs, state, ds_buf, ctid, BAR_DS_FREE, BAR_DS_FULL,
                NUM_CONSUMER_THREADS,
            )
        else:
            if cutlass.const_expr(self.p_smem):
                # Only this warpgroup's 64 rows of P^T feed its dV WGMMA: a warpgroup-local barrier.
                tPsP = sdp_mma.get_slice(opaque(ctid)).partition_C(sP[None, None, 0])
                cute.autovec_copy(tdVrP_as_S, tPsP)
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier(barrier_id=BAR_P + ctid // THREADS_PER_WG, number_of_threads=THREADS_PER_WG)
            # dV runs while dS^T is stored and the consumers meet at the barrier.
            mma.gemm(dv_mma, acc_dV, tdVA, tdVrdOt[None, None, None, state.index], zero_init=False)
            warpgroup.commit_group()

            if cutlass.const_expr(not self.ds_early):
                self.store_ds(sdp_mma, tdKrdS_as_S, sdS, ds_buf, ctid)
            # Generic-proxy stores must be visible to the WGMMA (async proxy) reads of sdS.
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=BAR_DS_FULL, number_of_threads=NUM_CONSUMER_THREADS)
            mma.gemm(dq_mma, acc_dQ, tdQrdS[None, None, None, ds_buf], tdQrKt[None, None, None, 0], zero_init=True)
            warpgroup.commit_group()
            mma.gemm(dkv_mma, acc_dK, tdKrdS, tdKrQt[None, None, None, state.index], zero_init=False)
            warpgroup.commit_group()
        self.step_tail(acc_dQ, sdQ, mdQacc, mSemQ, pipe_q, state, pipe_do, state, frag, ds_buf, ctid, i, m, n_block,
                       head, batch, num_n, seqlen_q, seqlen_k, spt, win, seq)

    @cute.jit
    def step_tail(self, acc_dQ, sdQ, mdQacc, mSemQ, pipe_q, q_state, pipe_do, do_state, frag, ds_buf, ctid, i, m,
                  n_block, head, batch, num_n, seqlen_q, seqlen_k, spt, win, seq):
        """The end of a step, its GEMMs issued in the order dV, dQ, dK (dk_before_dq: dV, dK, dQ):
        the Q and dO slots released as their last readers finish, dQ handed on."""
        # dV and dQ done, dK may still run: dO is free, and dQ leaves while dK computes.
        # (dk_before_dq: dV and dK done, dQ may still run: Q and dO are free, the next Q loads
        # under dQ, and dQ leaves after it.)
        warpgroup.wait_group(1)
        if cutlass.const_expr(self.cluster and not self.dk_before_dq):
            self.release_peer(frag, ds_buf, ctid)
        pipe_do.consumer_release(do_state)
        if cutlass.const_expr(self.dk_before_dq):
            pipe_q.consumer_release(q_state)
            warpgroup.wait_group(0)
            if cutlass.const_expr(self.cluster):
                self.release_peer(frag, ds_buf, ctid)
        if cutlass.const_expr(self.dq_bulk):
            # Wait until the writer warp's previous bulk reduction has read this warpgroup's
            # chunk of sdQ, then refill it: 16-byte stores, consecutive threads on consecutive
            # 16 bytes (no bank conflicts).
            self.dq_barrier(BAR_DQ_EMPTY, i % 2, ctid, True)
            cute.autovec_copy(dq_frag_view(acc_dQ), sdQ[None, ctid])
            # The bulk copy reads shared memory through the async proxy.
            cute.arch.fence_proxy("async.shared", space="cta")
            self.dq_barrier(BAR_DQ_FULL, i % 2, ctid, False)
        else:
            self.add_dq(acc_dQ, mdQacc, mSemQ, ctid, m, n_block, head, batch, num_n, seqlen_q, seqlen_k, spt, win, seq)
        if cutlass.const_expr(not self.dk_before_dq):
            warpgroup.wait_group(0)
            pipe_q.consumer_release(q_state)

    @cute.jit
    def gemm_dp(self, pipe_do, do_state, spec):
        """dP^T = V dO^T (queries-on-M: dP = dO V^T) once dO's slot is full, one commit group: ahead
        of S with dp_first, else after it (the exp then runs under dP). ``spec``: as
        fa4.common.mma.gemm_staged's."""
        pipe_do.consumer_wait(do_state)
        mma.gemm_staged(spec, True)

    @cute.jit
    def wait_dp(self, s_mn, seqlen_k):
        """Wait for the dP^T GEMM. With exp_pin, the exp2 (softcap: tanh) results in s_mn are
        fenced ahead of the wait (fa4.common.regs.pin_before), so that loop runs under the GEMM:
        without it ptxas sinks most of its MUFU work below the wait (hd128 causal: 27 of 32 per
        thread and step in the unmasked loop), to interleave it with the dS^T arithmetic."""
        if cutlass.const_expr(self.exp_pin):
            pin_before(seqlen_k, [s_mn[r, c] for r in range(cute.size(s_mn, mode=[0]))
                                  for c in range(cute.size(s_mn, mode=[1]))])
        warpgroup.wait_group(0)

    @cute.jit
    def store_ds(self, sdp_mma, tdKrdS_as_S, sdS, ds_buf, ctid):
        """This consumer's dS^T (16-bit, the accumulator layout) into sdS[ds_buf], the dQ GEMM's A
        operand (dkv_split 'keys')."""
        if cutlass.const_expr(self.ds_stages == 1):
            # One buffer: both consumers' previous dQ GEMMs must have read it.
            cute.arch.barrier(barrier_id=BAR_DS_FREE, number_of_threads=NUM_CONSUMER_THREADS)
        # Swizzled, transposed destination: addresses recomputed here, not held across the loop.
        if cutlass.const_expr(self.ds_stmatrix):
            # In an 8x8 block of the S^T accumulator a thread holds two adjacent queries of one key,
            # the stmatrix (non-transposed) register order, and sdS keeps queries contiguous: each
            # block row is one 16-byte chunk of the swizzled tile.
            st = cute.make_tiled_copy_C(
                cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), sdp_mma
            )
            st_thr = st.get_slice(opaque(ctid))
            cute.copy(st, st_thr.retile(tdKrdS_as_S), st_thr.partition_D(transpose_view(sdS)[None, None, ds_buf]))
        else:
            tdSsdS = sdp_mma.get_slice(opaque(ctid)).partition_C(transpose_view(sdS)[None, None, ds_buf])
            cute.autovec_copy(tdKrdS_as_S, tdSsdS)

    @cute.jit
    def apply_mask_t(self, s_mn, c0_mn, limits, q_base):
        """The S^T tile's mask (rows are keys, columns queries): fa4.common.masking.apply_mask_t."""
        key_limit, diag_hi, diag_lo = limits
        masking.apply_mask_t(s_mn, c0_mn, key_limit, diag_hi, diag_lo, q_base, self.causal, self.has_window_left,
                             self.has_window_right, self.config.mask_bits)

    # ---------------------------------------------------------------- helpers
