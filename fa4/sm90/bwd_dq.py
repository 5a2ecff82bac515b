"""The backward's dQ accumulation paths (a mixin of fa4.sm90.bwd.FlashBwdSm90) and its named barriers.

dq_accum 'bulk': two writer warps take the steps of alternate parity and add each staged dQ tile
(shared memory, fragment order) to the fp32 accumulator with one TMA bulk reduce-add; 'red' /
'red_v2': the consumers add their fragments with red.global(.v2). Deterministic mode orders the
adds of a query tile by a semaphore turn per (batch, head, query tile). With gqa_reduce 'loop' the
steps run over the group's (head, query tile) walk (fa4.common.bwd_schedule.group_step); varlen
adds into the sequence's padded rows (acc_rows). With cluster_exchange a CTA adds its half of
the tile's columns (fa4.common.bwd_pair), a tile of its own in fragment order.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from fa4.common import bwd_schedule, semaphore
from fa4.sm90 import bwd_cluster, bwd_epilogue
from fa4.sm90.bwd_config import THREADS_PER_WG
from fa4.sm90.bwd_prepost import dq_frag_layout, dq_frag_shape_stride, dq_frag_view

# Named barrier ids (0 is __syncthreads).
BAR_DS_FREE = 1  # 256 consumers: both dQ GEMMs have finished reading sdS (ds_stages 1 only)
BAR_DS_FULL = 2  # 256 consumers: both halves of dS^T are in sdS
BAR_SEM = bwd_epilogue.BAR_SEM  # 256 consumers: semaphore turn acquired / all adds issued
# dQ hand-off, per step parity p (two writer warps take turns) and consumer warpgroup w:
BAR_DQ_FULL = 4  # 4 + 2p + w: warpgroup w's dQ chunk is in sdQ -> writer warp p
BAR_DQ_EMPTY = 8  # 8 + 2p + w: the reduction of the previous step has read sdQ -> warpgroup w
BAR_P = 12  # 12..13: one consumer warpgroup's P^T rows are in sP (dv_operand 'smem')
BAR_EPI = bwd_epilogue.BAR_EPI  # 256 consumers: sK/sV free for the dK/dV tiles, then written (dkv_store 'tma')
NUM_CONSUMER_THREADS = 2 * THREADS_PER_WG
NUM_DQ_SYNC_THREADS = THREADS_PER_WG + 32


class DqAccumSteps:
    """dQ hand-off and reductions of the main backward kernel (uses the kernel's attributes:
    tile_m, tile_n, head_dim, dq_cols, cluster, deterministic, gqa_loop, red_v2, causal, the window
    flags, acc_rows)."""

    @cute.jit
    def dq_barrier(self, base: cutlass.Constexpr, parity, ctid, sync: cutlass.Constexpr):
        """Consumer side of barrier base + 2 parity + warpgroup, with immediate ids: a computed
        id would hold a register across the mainloop, where the consumers are at their limit."""
        for p in cutlass.range_constexpr(2):
            for w in cutlass.range_constexpr(2):
                if parity == p and ctid // THREADS_PER_WG == w:
                    if cutlass.const_expr(sync):
                        cute.arch.barrier(barrier_id=base + 2 * p + w, number_of_threads=NUM_DQ_SYNC_THREADS)
                    else:
                        cute.arch.barrier_arrive(barrier_id=base + 2 * p + w, number_of_threads=NUM_DQ_SYNC_THREADS)

    @cute.jit
    def dq_writer(
        self, sdQ, mdQacc, mSemQ, lane, n_block, head, batch, num_n, m_start, m_end, run, seqlen_q, seqlen_k, spt,
        win, group, seq, parity: cutlass.Constexpr,
    ):
        """One of two writer warps: adds the staged dQ tiles of the steps of its parity (steps
        counted over the (head, m_block) walk of the CTA, fa4.common.bwd_schedule.group_step)."""
        nbytes = self.tile_m * self.dq_cols * 4
        # cluster_exchange: this CTA's half of the tile, the second half of it for rank 1.
        half_off = 0
        if cutlass.const_expr(self.cluster):
            half_off = bwd_cluster.cluster_rank() * (self.tile_m * self.dq_cols)
        # sdQ starts empty (no arrive for an empty range: every arrive must meet a consumer wait).
        if cutlass.const_expr(parity == 0):
            if m_start < m_end:
                for wg in cutlass.range_constexpr(2):
                    cute.arch.barrier_arrive(barrier_id=BAR_DQ_EMPTY + wg, number_of_threads=NUM_DQ_SYNC_THREADS)
        # t: the step (gqa_reduce 'loop', over the group's heads) or, one head, the query tile itself.
        t_start, t_end = m_start + parity, m_end
        if cutlass.const_expr(self.gqa_loop):
            t_start, t_end = parity, group * (m_end - m_start)
        for t in cutlass.range(t_start, t_end, 2, unroll=1):
            h, m = head, t
            if cutlass.const_expr(self.gqa_loop):
                hl, m = bwd_schedule.group_step(t, m_start, m_end)
                h = head + hl
            m = self.walk(m, run, n_block)
            turn = 1  # not deterministic: no first turn, every tile adds (decided while tracing)
            if cutlass.const_expr(self.deterministic):
                # Take the turn while the consumers are still computing this tile: the lock's
                # round trip through L2 stays off the path from "dQ staged" to "dQ added".
                turn = self.turn(m, n_block, num_n, seqlen_q, seqlen_k, spt, win)
                semaphore.wait_turn(mSemQ[batch, h, None].iterator + m, turn, lane == 0)
            for wg in cutlass.range_constexpr(2):
                cute.arch.barrier(barrier_id=BAR_DQ_FULL + 2 * parity + wg, number_of_threads=NUM_DQ_SYNC_THREADS)
            if lane == 0:
                if cutlass.const_expr(self.deterministic):
                    # The previous turn's adds were made by the async proxy: order ours after them.
                    cute.arch.fence_proxy("async.global")
                gdQ = cute.local_tile(self.acc_rows(mdQacc, batch, h, seq[0]), (self.tile_m, self.head_dim), (m, 0))
                # Both warpgroups' chunks: one contiguous tile in fragment order. The first turn
                # stores (deterministic: the sums are not zeroed, fa4.common.bwd_schedule.dq_zero_rows).
                if turn == 0:
                    semaphore.bulk_store_f32(gdQ.iterator + half_off, sdQ.iterator, nbytes)
                else:
                    semaphore.bulk_reduce_add_f32(gdQ.iterator + half_off, sdQ.iterator, nbytes)
                cute.arch.cp_async_bulk_commit_group()
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            cute.arch.sync_warp()
            # sdQ may be refilled for the next step (the other parity). No arrive after the last
            # tile: every arrive must meet a consumer wait.
            if t + 1 < t_end:
                for wg in cutlass.range_constexpr(2):
                    cute.arch.barrier_arrive(
                        barrier_id=BAR_DQ_EMPTY + 2 * (1 - parity) + wg, number_of_threads=NUM_DQ_SYNC_THREADS
                    )
            if cutlass.const_expr(self.deterministic):
                if lane == 0:
                    # The next turn may only start once our adds are performed, not just read.
                    cute.arch.cp_async_bulk_wait_group(0, read=False)
                    cute.arch.fence_proxy("async.global")
                semaphore.pass_turn(mSemQ[batch, h, None].iterator + m, lane == 0)
        if lane == 0:
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def add_dq(self, acc_dQ, mdQacc, mSemQ, ctid, m, n_block, head, batch, num_n, seqlen_q, seqlen_k, spt, win, seq):
        gdQ = cute.local_tile(self.acc_rows(mdQacc, batch, head, seq[0]), (self.tile_m, self.head_dim), (m, 0))
        # This thread's values in the tile's fragment order (the accumulator's layout): value
        # (a, b) of the (4, F/4) register view lies at thread_base + a + 512 b.
        lay = dq_frag_layout(self.tile_m, self.dq_cols)
        # Element offsets inside a thread's part: the value modes' strides of the same layout.
        (_, _), ((s_a, s_b), _) = dq_frag_shape_stride(self.tile_m, self.dq_cols)
        base = gdQ.iterator + cute.crd2idx(((0, 0), ctid), lay)
        if cutlass.const_expr(self.cluster):
            # This CTA's half of the tile (fa4.common.bwd_pair), the second for rank 1.
            base = base + bwd_cluster.cluster_rank() * (self.tile_m * self.dq_cols)
        r = dq_frag_view(acc_dQ)
        if cutlass.const_expr(self.deterministic):
            sem = mSemQ[batch, head, None].iterator + m
            turn = self.turn(m, n_block, num_n, seqlen_q, seqlen_k, spt, win)
            semaphore.wait_turn(sem, turn, ctid == 0)
            cute.arch.barrier(barrier_id=BAR_SEM, number_of_threads=NUM_CONSUMER_THREADS)
            # The first turn stores: the sums are not zeroed (fa4.common.bwd_schedule.dq_zero_rows).
            if turn == 0:
                self.dq_fragment_out(r, base, s_a, s_b, True)
            else:
                self.dq_fragment_out(r, base, s_a, s_b, False)
            cute.arch.barrier(barrier_id=BAR_SEM, number_of_threads=NUM_CONSUMER_THREADS)
            semaphore.pass_turn(sem, ctid == 0)
        else:
            self.dq_fragment_out(r, base, s_a, s_b, False)

    @cute.jit
    def dq_fragment_out(self, r, base, s_a, s_b, store: cutlass.Constexpr):
        """This thread's dQ values into the fp32 tile: relaxed adds, or stores on a first turn."""
        one = semaphore.st_f32 if store else semaphore.red_add_f32
        two = semaphore.st_f32x2 if store else semaphore.red_add_f32x2
        for b in cutlass.range_constexpr(cute.size(r, mode=[1])):
            if cutlass.const_expr(self.red_v2):
                for a in cutlass.range_constexpr(2):
                    two(base + (2 * a * s_a + b * s_b), r[2 * a, b], r[2 * a + 1, b])
            else:
                for a in cutlass.range_constexpr(4):
                    one(base + (a * s_a + b * s_b), r[a, b])

    def turn(self, m, n_block, num_n, seqlen_q, seqlen_k, spt, win):
        return bwd_schedule.dq_turn(m, n_block, self.tile_m, self.tile_n, num_n, seqlen_q, seqlen_k, self.causal, spt,
                                    self.has_window_left, self.has_window_right, *win)

