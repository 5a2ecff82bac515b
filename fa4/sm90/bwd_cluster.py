"""cluster_exchange: the 2-CTA dS exchange of the backward's dkv_split 'head_dim' kernel.

Which CTA reduces which dQ terms is fa4.common.bwd_pair. Here, the kernel side: CTA r of a
cluster (key tile 2p + r) holds, beside its own tiles,

    sKp   (64 keys x d/2)          the peer's K tile in this CTA's dQ columns, loaded once by TMA
                                   on the K/V barrier (the B operand of the peer half of dQ)
    sdSp  (tile_m x 64, ds_stages)  the peer's dS tiles, written by the peer's bulk copies
    full[b], empty[b]               mbarriers per dS buffer b

and per step (buffer b, its j-th use):

    wait empty[b] (phase j-1)   the peer's dQ GEMM of the previous use has read its copy of my
                                dS, so my copy out of sdS[b] has completed: sdS[b] is mine again
    store P^T, dS^T; fence; consumer barrier (as without the exchange)
    one thread: arm full[b] (tile bytes), bulk-copy sdS[b] into the peer's sdSp[b] completing on
                the peer's full[b]
    dV GEMM; wait full[b] (phase j): the peer's dS is in sdSp[b]
    dQ[:, cols_r] = dS_own K_own[:, cols_r] + dS_peer K_peer[:, cols_r]; dK GEMM
    once dQ's GEMMs are done: each warpgroup arrives on the peer's empty[b] (cluster scope)

(dk_before_dq: the dK GEMM right after dV, before the wait on full[b]; empty[b] then waits for
all of the step's GEMMs.)

The consumers' register state is the kernel's own: the dQ accumulator is half as wide.
"""
# (No "from __future__ import annotations": cute.struct reads its field annotations as objects.)


import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass._mlir.dialects import nvvm
from cutlass.cute.nvgpu import warpgroup

from fa4.common import bwd_pair, dsmem, mma, scheduling
from fa4.common.layout import transpose_view
from fa4.common.regs import opaque
from fa4.sm90 import bwd_split
from fa4.sm90.bwd_config import THREADS_PER_WG


def peer_k_layout(kernel, sdp_tiler):
    """(64 keys, d/2, 1) K-major, read MN-major in the warpgroups' d/4 column slices."""
    tile_n, tile_m, _ = sdp_tiler
    return bwd_split.k_major_layout("a", (tile_n, tile_m, kernel.dq_cols), kernel.dtype, 1, kernel.dq_cols // 2)


def cluster_storage(kernel, sKp_layout, sdS_layout):
    ds_stages = kernel.ds_stages

    @cute.struct
    class ClusterStorage:
        mbar_x: cute.struct.MemRange[cutlass.Int64, 2 * ds_stages]  # full[b], then empty[b]
        sKp: cute.struct.Align[cute.struct.MemRange[kernel.dtype, cute.cosize(sKp_layout)], 1024]
        sdSp: cute.struct.Align[cute.struct.MemRange[kernel.dtype, cute.cosize(sdS_layout)], 1024]

    return ClusterStorage


@cute.jit
def init_barriers(ds_stages: cutlass.Constexpr, mbar_x, tidx):
    """full[b]: one arrive (this CTA's arming thread) plus the peer copy's bytes; empty[b]: one
    arrive per consumer warpgroup of the peer."""
    if tidx == 0:
        for b in cutlass.range_constexpr(ds_stages):
            cute.arch.mbarrier_init(mbar_x + b, 1)
            cute.arch.mbarrier_init(mbar_x + ds_stages + b, 2)


def rank_of(bidx):
    """The CTA's rank in its cluster (clusters of two along the grid's x)."""
    return bidx % bwd_pair.PAIR


def cluster_rank():
    """rank_of(block index), read from the cluster's special register (no live register)."""
    return cute.arch.block_idx_in_cluster()


@cute.jit
def load_peer_k(tma_kp, mKp, sKp, bar, n_block, rank, head_kv, batch, tile_n: cutlass.Constexpr,
                cols: cutlass.Constexpr):
    """The peer's key tile (n_block ^ 1), this CTA's dQ columns, on the K/V barrier ``bar``. The
    odd tail's empty tile is past seqlen_k: TMA fills it with zeros (and still counts its bytes)."""
    gKp = cute.flat_divide(mKp, (tile_n, cols))[None, None, None, None, head_kv, batch]
    tKps, tKpg = cute.nvgpu.cpasync.tma_partition(
        tma_kp, 0, cute.make_layout(1), cute.group_modes(sKp, 0, 2), cute.group_modes(gKp, 0, 2)
    )
    peer_n = n_block + 1 - 2 * rank
    cute.copy(tma_kp, tKpg[None, peer_n, rank], tKps[None, 0], tma_bar_ptr=bar)


@cute.jit
def pair_tile(bidx, num_n, num_heads, num_bh, head_swizzle, spt):
    """(n_block, head, batch) of this CTA: clusters walk (pair, head, batch) as the CTAs without the
    exchange walk (key tile, head, batch); the pair's query range is bwd_pair.pair_segments."""
    pair, head, batch = scheduling.decode_tile(
        bidx // bwd_pair.PAIR, bwd_pair.num_pairs(num_n), num_heads, num_bh, head_swizzle, spt
    )
    return bwd_pair.n_block_of(pair, rank_of(bidx)), head, batch


def peer_fragments(dq_wg, cluster_smem, sdS, sK):
    """The peer's dS and K columns as dQ operands (this CTA's own K columns are made per step).
    ``cluster_smem``: (tma_kp, mKp, sKp, sdSp, mbar_x) of the kernel."""
    _, _, sKp, sdSp, mbar_x = cluster_smem
    tdQrdSp = dq_wg.make_fragment_A(dq_wg.partition_A(sdSp))
    tdQrKp = dq_wg.make_fragment_B(dq_wg.partition_B(transpose_view(sKp)))
    return tdQrdSp, tdQrKp, mbar_x, sdS, sdSp, sK


def own_k_half(sK, rank, cols: int, tile_n: int):
    """K^T of this CTA's key tile in its dQ columns: (cols, tile_n), a runtime whole-atom offset."""
    return cute.flat_divide(transpose_view(sK)[None, None, 0], (cols, tile_n))[None, None, rank, 0]


class ClusterSteps:
    """The exchange's parts of the kernel (a FlashBwdSm90 mixin, with bwd_split.DkvSplitSteps)."""

    @cute.jit
    def producer_peer_k(self, cluster_smem, pipe_kv, n_block, head_kv, batch):
        """The peer's K columns, from the producer warpgroup's otherwise idle fourth warp: in warp 0
        their descriptor and coordinates spilled out of the producer's 24 registers. The bytes may
        complete on the K/V barrier before warp 0 arms it (it cannot complete before that arrive)."""
        tma_kp, mKp, sKp, _, _ = cluster_smem
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        # The whole warp calls the copy: a TMA copy elects its own issuing thread, and an elect
        # inside elect_one's single thread waits for the 31 lanes that never come (the H200 hang).
        load_peer_k(tma_kp, mKp, sKp, pipe_kv.producer_get_barrier(kv_state), n_block, cluster_rank(), head_kv,
                    batch, self.tile_n, self.dq_cols)

    @cute.jit
    def cluster_exchange_and_gemms(
        self, sdp_mma, dkv_mma, dv_mma, dq_mma, frag, accs, state, ds_buf, ctid, i, bar_ds_free, bar_ds_full,
        num_consumer_threads: cutlass.Constexpr,
    ):
        """As split_exchange_and_gemms, with dS also copied to the peer and dQ over both key tiles."""
        _, _, _, _, tdVrdOt, tdKrQt, tdQrdS, _, _, _, tdVsP, sP, tdKsdSt, sdSt = frag[:14]
        tdQrdSp, tdQrKp, mbar_x, sdS, sdSp, sK = frag[14]
        # Rank and the own-K operand are recomputed per step: held across the loop they spilled
        # (the consumers are at their register limit at head_dim 256).
        # (At the warpgroup's first thread: a shared-memory operand, fa4.common.mma.wg_slices.)
        rank = cluster_rank()
        (dq_wg,) = mma.wg_slices(opaque(ctid), dq_mma)
        tdQrKo = dq_wg.make_fragment_B(dq_wg.partition_B(own_k_half(sK, rank, self.dq_cols, self.tile_n)))
        _, _, acc_dV, acc_dK, acc_dQ, _, _, tdVrP_as_S, tdKrdS_as_S, _, _ = accs
        j = i // self.ds_stages
        full = mbar_x + ds_buf
        empty = mbar_x + self.ds_stages + ds_buf
        # The peer has read its copy of this buffer's previous use: that copy (out of sdS[ds_buf])
        # has completed too. A fresh barrier passes the first use (parity 1 = the phase before).
        cute.arch.mbarrier_wait(empty, (j + 1) % 2)
        self.publish_p_ds(sdp_mma, tdVrP_as_S, tdKrdS_as_S, sP, sdSt, ds_buf, ctid, bar_ds_free, bar_ds_full,
                          num_consumer_threads)
        nbytes = self.tile_m * self.tile_n * 2
        if ctid == 0:
            # Arm this CTA's full[b] for the peer's copy (its bytes may land before this).
            cute.arch.mbarrier_arrive_and_expect_tx(full, nbytes)
            dsmem.bulk_copy_to_peer(
                sdSp[None, None, ds_buf].iterator, sdS[None, None, ds_buf].iterator, nbytes, full, 1 - rank
            )
        dk = (dkv_mma, acc_dK, tdKsdSt, ds_buf, tdKrQt, state.index)
        mma.gemm_staged((dv_mma, acc_dV, tdVsP, ds_buf, tdVrdOt, state.index), False)
        if cutlass.const_expr(self.dk_before_dq):
            # dK needs only this CTA's dS: issued before the wait for the peer's.
            mma.gemm_staged(dk, False)
        # The peer's dS of this step is in sdSp[ds_buf] (bytes delivered through the mbarrier).
        cute.arch.mbarrier_wait(full, j % 2)
        mma.gemm(dq_mma, acc_dQ, tdQrdS[None, None, None, ds_buf], tdQrKo, zero_init=True)
        mma.gemm(dq_mma, acc_dQ, tdQrdSp[None, None, None, ds_buf], tdQrKp[None, None, None, 0], zero_init=False)
        warpgroup.commit_group()
        if cutlass.const_expr(not self.dk_before_dq):
            mma.gemm_staged(dk, False)

    @cute.jit
    def release_peer(self, frag, ds_buf, ctid):
        """This warpgroup's dQ GEMMs are done (waited for): the peer may reuse its dS buffer."""
        _, _, mbar_x, _, _, _ = frag[14]
        if ctid % THREADS_PER_WG == 0:
            cute.arch.mbarrier_arrive(mbar_x + self.ds_stages + ds_buf, peer_cta_rank_in_cluster=1 - cluster_rank(),
                                      scope=nvvm.MemScopeKind.CLUSTER)
