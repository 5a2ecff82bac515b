"""The producer warp of the Hopper backward's main kernel (a FlashBwdSm90 mixin, fa4.sm90.bwd).

Warp 0 of warpgroup 0 loads the CTA's K and V tile once, then walks its query tiles (under GQA with
gqa_reduce 'loop' those of each query head of the group, head-major: fa4.common.bwd_schedule.
group_step) and streams Q with its LSE row and dO with its D row through the mbarrier rings by TMA,
in the order the consumers' first GEMMs need them.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync

from fa4.common import varlen
from fa4.common.tma import seq_tiles
from fa4.sm90.bwd_config import SEQ_PAD


class ProducerSteps:
    """The loads of the main kernel (see the module docstring)."""

    @cute.jit
    def producer(
        self, tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, tma_lse, mLSE2, tma_dsum, mDsum,
        sQ, sdO, sK, sV, sLSE, sDsum, pipe_kv, pipe_q, pipe_do, n_block, head, head_kv, batch, m_start, m_end, run,
        group, seq,
    ):
        d = self.head_dim
        if cutlass.const_expr(self.varlen):
            # The packed tensors shifted to the sequence's first row (the TMA coordinates), the
            # row statistics to its padded region: a tile past the sequence's end reads the next
            # sequence's rows, which the statistics (LSE2 +inf, D 0) and the key mask leave out.
            off_q, off_k = seq[0], seq[1]
            pad_q = varlen.padded_offset(off_q, batch, SEQ_PAD)
            mQ = cute.domain_offset((off_q, 0, 0, 0), mQ)
            mdO = cute.domain_offset((off_q, 0, 0, 0), mdO)
            mK = cute.domain_offset((off_k, 0, 0, 0), mK)
            mV = cute.domain_offset((off_k, 0, 0, 0), mV)
            mLSE2 = cute.domain_offset((pad_q, 0, 0), mLSE2)
            mDsum = cute.domain_offset((pad_q, 0, 0), mDsum)
            batch = 0
        for atom in (tma_q, tma_do, tma_k, tma_v, tma_lse, tma_dsum):
            cpasync.prefetch_descriptor(atom)
        one = cute.make_layout(1)
        tKsK, tKgK = seq_tiles(tma_k, mK, sK, (self.tile_n, d), head_kv, batch)
        tVsV, tVgV = seq_tiles(tma_v, mV, sV, (self.tile_n, self.head_dim_v), head_kv, batch)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.q_stages)
        # dO's ring: Q's state, or with do_single a one-slot ring of its own. (Never an alias of Q's:
        # the loop below carries each name as its own value, and an alias would not advance.)
        do_state = None
        if cutlass.const_expr(self.do_stages != self.q_stages):
            do_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.do_stages)
        pipe_kv.producer_acquire(kv_state)
        bar = pipe_kv.producer_get_barrier(kv_state)
        cute.copy(tma_k, tKgK[None, n_block], tKsK[None, 0], tma_bar_ptr=bar)
        cute.copy(tma_v, tVgV[None, n_block], tVsV[None, 0], tma_bar_ptr=bar)
        # The (head, m_block) walk of fa4.common.bwd_schedule.group_step: head-major, one ring state
        # across the heads, so the consumers' step index addresses the same slots.
        for hl in cutlass.range(group, unroll=1):
            h = head + hl
            tQsQ, tQgQ = seq_tiles(tma_q, mQ, sQ, (self.tile_m, d), h, batch)
            tdOsdO, tdOgdO = seq_tiles(tma_do, mdO, sdO, (self.tile_m, self.head_dim_v), h, batch)
            gLSE = cute.flat_divide(mLSE2, (self.tile_m,))[None, None, h, batch]
            gDsum = cute.flat_divide(mDsum, (self.tile_m,))[None, None, h, batch]
            tLsL, tLgL = cpasync.tma_partition(
                tma_lse, 0, one, cute.group_modes(sLSE, 0, 1), cute.group_modes(gLSE, 0, 1)
            )
            tDsD, tDgD = cpasync.tma_partition(
                tma_dsum, 0, one, cute.group_modes(sDsum, 0, 1), cute.group_modes(gDsum, 0, 1)
            )
            for m_walk in cutlass.range(m_start, m_end, unroll=1):
                m = self.walk(m_walk, run, n_block)
                # In the order the consumers' first GEMMs need them (dp_first: dO, whose slot
                # frees earlier in a step, then Q).
                if cutlass.const_expr(self.dp_first):
                    self.load_tile(pipe_do, self.do_ring(state, do_state), tma_do, tdOgdO, tdOsdO, tma_dsum, tDgD,
                                   tDsD, m)
                self.load_tile(pipe_q, state, tma_q, tQgQ, tQsQ, tma_lse, tLgL, tLsL, m)
                if cutlass.const_expr(not self.dp_first):
                    self.load_tile(pipe_do, self.do_ring(state, do_state), tma_do, tdOgdO, tdOsdO, tma_dsum, tDgD,
                                   tDsD, m)
                state.advance()
                if cutlass.const_expr(self.do_stages != self.q_stages):
                    do_state.advance()

    def do_ring(self, q_state, do_state):
        """The producer's dO ring state: Q's, or its own with do_single."""
        return do_state if self.do_stages != self.q_stages else q_state

    @cute.jit
    def load_tile(self, pipe, state, tma_x, tXgX, tXsX, tma_stat, tSg, tSs, m):
        """Query tile m of Q (with its LSE row) or dO (with D) into ring slot state.index."""
        pipe.producer_acquire(state)
        bar = pipe.producer_get_barrier(state)
        cute.copy(tma_x, tXgX[None, m], tXsX[None, state.index], tma_bar_ptr=bar)
        cute.copy(tma_stat, tSg[None, m], tSs[None, state.index], tma_bar_ptr=bar)

    def heads_walked(self, qhead_per_kvhead):
        """Query heads a CTA walks: its K/V head's group with gqa_reduce 'loop', else its own one
        (a Python 1: the loops over heads fold away and the kernel is the one of before)."""
        return qhead_per_kvhead if self.gqa_loop else 1
