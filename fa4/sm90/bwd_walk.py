"""Which tiles a CTA of the Hopper backward's main kernel works on, and in which order (a
FlashBwdSm90 mixin, fa4.sm90.bwd).

tile_coords decodes the CTA's block index into its key tile, query head (under GQA 'loop', its
K/V head's group), sequence and query-tile segments: the launch order (fa4.common.scheduling:
SPT/LPT, head swizzle), a cluster pair's shared tiles (fa4.common.bwd_pair), varlen's packed key
axis (fa4.common.varlen) and the causal or windowed bounds (fa4.common.bwd_schedule). The walk
methods map a consumer loop's position to the query tile it processes: walking down from the
diagonal (walk_down) or starting each key tile's unmasked run at a shifted tile (q_starts), so that
CTAs launched together do not add into the same dQ tile at once. The index arithmetic itself is in
fa4.common.bwd_schedule, where the host tests it.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from fa4.common import bwd_pair, bwd_schedule, scheduling, varlen
from fa4.sm90 import bwd_cluster


class WalkSteps:
    """The CTA's tiles and walk order (see the module docstring)."""

    @cute.jit
    def tile_coords(self, bidx, mQ, mK, head_swizzle, spt, win, vl):
        """The CTA's (key tile, head, sequence), its query-tile segments and ``seq`` = (offset_q,
        offset_k, seqlen_q, seqlen_k) of its sequence (offsets 0 and the tensors' lengths dense)."""
        seqlen_q = mQ.shape[0]
        seqlen_k = mK.shape[0]
        num_heads = mQ.shape[2]
        num_n, num_bh = scheduling.tile_grid(seqlen_k, self.tile_n, num_heads, mQ.shape[3], vl)
        qhead_per_kvhead = num_heads // mK.shape[2]
        if cutlass.const_expr(self.gqa_loop):
            # head: the group's first query head; the CTA walks qhead_per_kvhead of them.
            n_block, head_kv, batch = scheduling.decode_tile(
                bidx, num_n, mK.shape[2], mK.shape[2] * mQ.shape[3], head_swizzle, spt
            )
            head = head_kv * qhead_per_kvhead
        elif cutlass.const_expr(self.cluster):
            n_block, head, batch = bwd_cluster.pair_tile(bidx, num_n, num_heads, num_bh, head_swizzle, spt)
            head_kv = head // qhead_per_kvhead
        elif cutlass.const_expr(self.compact):
            # A tile t of the packed key axis (one grid row of all sequences' regions a head), then
            # its sequence and its key tile there; a spare tile's n_block is past its keys (it exits).
            nseq = vl[0].shape[0] - 1
            t, head, _ = scheduling.decode_tile(
                bidx, varlen.compact_tiles(mK.shape[0], nseq, self.tile_n), num_heads, num_heads, head_swizzle, spt
            )
            batch = varlen.tile_sequence(vl[1], nseq, t, self.tile_n)
            n_block = t - varlen.tile_start(vl[1], batch, self.tile_n)
            head_kv = head // qhead_per_kvhead
        else:
            n_block, head, batch = scheduling.decode_tile(bidx, num_n, num_heads, num_bh, head_swizzle, spt)
            head_kv = head // qhead_per_kvhead
        seq = varlen.seq_info(None if vl is None else vl[:4], batch, seqlen_q, seqlen_k)
        seqlen_q, seqlen_k = seq[2], seq[3]
        if cutlass.const_expr(self.cluster):
            # Both CTAs of a pair walk its 128 keys' query tiles (the masks are per CTA).
            m_start, m_masked_end, m_unmasked_end, m_end = bwd_pair.pair_segments(
                n_block // bwd_pair.PAIR, self.tile_m, seqlen_q, seqlen_k, self.causal
            )
        else:
            m_start, m_masked_end, m_unmasked_end, m_end = bwd_schedule.m_block_segments(
                n_block, self.tile_m, self.tile_n, seqlen_q, seqlen_k, self.causal,
                self.has_window_left, self.has_window_right, *win,
            )
        return (n_block, head, head_kv, batch, qhead_per_kvhead, num_n, m_start, m_masked_end, m_unmasked_end, m_end,
                seq)

    def walk_span(self, segments):
        """The query tiles the walk reorders, from (m_start, m_masked_end, m_unmasked_end, m_end):
        all of them walking down, else the unmasked run (q_starts' shifts)."""
        m_start, m_masked_end, m_unmasked_end, m_end = segments
        if cutlass.const_expr(self.walk_down):
            return (m_start, m_end)
        return (m_masked_end, m_unmasked_end)

    def walk_segments(self, segments):
        """The consumers' loops over walk positions, in walk order (bwd_schedule.walk_runs)."""
        return bwd_schedule.walk_runs(segments, self.walk_down, self.has_window_left)

    def walked(self, m, step_base, span, n_block, masked):
        """(query tile, step base) at position m of a consumer loop: the tile of walk(), and the
        base moved with it so that step() still counts m - base steps (its ring position).
        Unchanged, nothing traced, walking up without q_starts and in the up walk's masked runs."""
        if cutlass.const_expr(not self.walk_down and (self.q_starts == 1 or masked)):
            return m, step_base
        mq = self.walk(m, span, n_block, within=True)
        return mq, step_base + (mq - m)

    def walk(self, m, span, n_block, within=False):
        """The query tile at walk position m, ``span`` the walk_span (bwd_schedule.walk_down_tile or
        walk_tile; a cluster pair walks as one)."""
        if cutlass.const_expr(self.walk_down):
            return bwd_schedule.walk_down_tile(m, span[0], span[1])
        if cutlass.const_expr(self.q_starts == 1):
            return m
        key_tile = n_block // bwd_pair.PAIR if self.cluster else n_block
        return bwd_schedule.walk_tile(m, span[0], span[1], key_tile, self.q_starts, within)
