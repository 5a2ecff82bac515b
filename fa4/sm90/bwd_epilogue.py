"""The dK/dV epilogue of the Hopper backward (a FlashBwdSm90 mixin, fa4.sm90.bwd).

Three ways out of a CTA's fp32 dK/dV accumulators: relaxed reductions into the GQA fp32
accumulators (red_tile), element stores from the fragment with rows past seqlen_k dropped
(store_dkv_rows: dkv_store 'direct', and a varlen sequence's last, partial key tile), and stmatrix
into the K/V shared tiles plus one TMA store each (store_dkv_tma).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.nvgpu import warp

from fa4.common import semaphore
from fa4.common.layout import acc_as_rows_cols, transpose_view
from fa4.common.tma import seq_tiles
from fa4.sm90.bwd_config import THREADS_PER_WG
from fa4.sm90.bwd_prepost import dq_frag_layout, dq_frag_view

# Named barriers of fa4.sm90.bwd (the list is fa4.sm90.bwd_dq's), 256 consumers each: the GQA
# dK/dV semaphore turn acquired, then all adds issued; sK/sV free for the dK/dV tiles, then written.
BAR_SEM = 3
BAR_EPI = 14
NUM_CONSUMER_THREADS = 2 * THREADS_PER_WG


class DkvStores:
    """dK/dV leaving the CTA (see the module docstring)."""

    @cute.jit
    def epilogue(
        self, dkv_mma, dkv_thr, acc_dK, acc_dV, mdK, mdV, mSemKV, ctid, n_block, head, head_kv, batch,
        qhead_per_kvhead, seq, scale, sK, sV, tma_dkv, dv_out, sQ,
    ):
        d, dv = self.head_dim, self.head_dim_v
        off_k, seqlen_k = seq[1], seq[3]
        dv_mma, dv_thr = dv_out  # dV's accumulator partition (dK's own where the shapes agree)
        for i in cutlass.range_constexpr(cute.size(acc_dK)):
            acc_dK[i] = acc_dK[i] * scale
        if cutlass.const_expr(self.gqa_atomic):
            # fp32 accumulators (batch, heads_kv, seqlen_k_pad, d), summed over the query heads.
            # Varlen: the sequence's padded region (its tiles' rows past seqlen_k add zeros there).
            gdK = cute.local_tile(self.acc_rows(mdK, batch, head_kv, off_k), (self.tile_n, d), (n_block, 0))
            gdV = cute.local_tile(self.acc_rows(mdV, batch, head_kv, off_k), (self.tile_n, dv), (n_block, 0))
            if cutlass.const_expr(self.gqa_last):
                self.finish_in_kernel(dkv_thr, dv_thr, acc_dK, acc_dV, gdK, gdV, tma_dkv[2], tma_dkv[3], mSemKV,
                                      ctid, n_block, head, head_kv, batch, qhead_per_kvhead, seq)
            elif cutlass.const_expr(self.gqa_bulk):
                self.add_bulk(acc_dK, acc_dV, gdK, gdV, sK, sQ, mSemKV, ctid, n_block, head, head_kv, batch,
                              qhead_per_kvhead)
            else:
                self.add_to_sums(dkv_thr, dv_thr, acc_dK, acc_dV, gdK, gdV, mSemKV, ctid, n_block, head, head_kv,
                                 batch, qhead_per_kvhead, seqlen_k, d, dv)
        elif cutlass.const_expr(self.dkv_tma):
            if cutlass.const_expr(self.varlen):
                # Whole key tiles of the sequence by TMA at its offset; its last, partial tile by
                # predicated stores (the box would run into the next sequence's rows).
                if (n_block + 1) * self.tile_n <= seqlen_k:
                    self.store_dkv_tma(
                        dkv_mma, acc_dK, acc_dV, cute.domain_offset((off_k, 0, 0, 0), mdK),
                        cute.domain_offset((off_k, 0, 0, 0), mdV), sK, sV, tma_dkv, ctid, n_block, head_kv, 0, dv_mma,
                    )
                else:
                    self.store_dkv_rows(dkv_thr, dv_thr, acc_dK, acc_dV, tma_dkv[2], tma_dkv[3], n_block, head_kv,
                                        batch, seq)
            else:
                self.store_dkv_tma(
                    dkv_mma, acc_dK, acc_dV, mdK, mdV, sK, sV, tma_dkv, ctid, n_block, head_kv, batch, dv_mma
                )
        else:
            self.store_dkv_rows(dkv_thr, dv_thr, acc_dK, acc_dV, mdK, mdV, n_block, head_kv, batch, seq)

    @cute.jit
    def add_to_sums(self, dkv_thr, dv_thr, acc_dK, acc_dV, gdK, gdV, mSemKV, ctid, n_block, head, head_kv, batch,
                    qhead_per_kvhead, seqlen_k, d: cutlass.Constexpr, dv: cutlass.Constexpr):
        """gqa_finish 'postprocess': add this CTA's tiles into the zeroed fp32 sums (deterministic: in
        head order, behind the tile's semaphore; the first head's CTA stores its tiles, so the sums
        need no zeros)."""
        if cutlass.const_expr(self.deterministic):
            sem = mSemKV[batch, head_kv, None].iterator + n_block
            turn = head - head_kv * qhead_per_kvhead
            semaphore.wait_turn(sem, turn, ctid == 0)
            cute.arch.barrier(barrier_id=BAR_SEM, number_of_threads=NUM_CONSUMER_THREADS)
            if turn == 0:
                self.sum_tiles(dkv_thr, dv_thr, acc_dK, acc_dV, gdK, gdV, n_block, seqlen_k, d, dv, True)
            else:
                self.sum_tiles(dkv_thr, dv_thr, acc_dK, acc_dV, gdK, gdV, n_block, seqlen_k, d, dv, False)
            cute.arch.barrier(barrier_id=BAR_SEM, number_of_threads=NUM_CONSUMER_THREADS)
            semaphore.pass_turn(sem, ctid == 0)
        else:
            self.sum_tiles(dkv_thr, dv_thr, acc_dK, acc_dV, gdK, gdV, n_block, seqlen_k, d, dv, False)

    @cute.jit
    def add_bulk(self, acc_dK, acc_dV, gdK, gdV, sK, sQ, mSemKV, ctid, n_block, head, head_kv, batch,
                 qhead_per_kvhead):
        """gqa_add 'bulk': the tiles into shared memory in the dQ accumulator's fragment order (dK's
        (2, 1, 1) x (64, d) MMA is dQ 'rows''s at tile_n rows), then one bulk reduction each into the
        fragment-ordered sums. K and V hold tile_n (d + dv) bf16, exactly one fp32 tile (dv == d:
        violations()); dV goes over the Q and dO rings where they hold it (stages x tile_m >= tile_n),
        else over K and V again once dK's reduction has read them. Deterministic: in head order behind
        the tile's semaphore, the first head's CTA storing its tiles (the sums are not zeroed)."""
        d, dv = self.head_dim, self.head_dim_v
        ring = (self.q_stages * d + self.do_stages * dv) * self.tile_m * 2
        sem, turn = None, None
        if cutlass.const_expr(self.deterministic):
            sem = mSemKV[batch, head_kv, None].iterator + n_block
            turn = head - head_kv * qhead_per_kvhead
        # Both consumers' last GEMMs read K, V, Q and dO: done before either warpgroup overwrites them.
        cute.arch.barrier(barrier_id=BAR_EPI, number_of_threads=NUM_CONSUMER_THREADS)
        if cutlass.const_expr(ring >= self.tile_n * dv * 4):
            self.stage_tile(acc_dK, sK, d, ctid)
            self.stage_tile(acc_dV, sQ, dv, ctid)
            self.bulk_add_staged(((sK, d, gdK), (sQ, dv, gdV)), ctid, sem, turn, True, True)
        else:
            self.stage_tile(acc_dK, sK, d, ctid)
            self.bulk_add_staged(((sK, d, gdK),), ctid, sem, turn, True, False)
            # K and V are free again once the reduction has read them (the issuing thread waited).
            cute.arch.barrier(barrier_id=BAR_EPI, number_of_threads=NUM_CONSUMER_THREADS)
            self.stage_tile(acc_dV, sK, dv, ctid)
            self.bulk_add_staged(((sK, dv, gdV),), ctid, sem, turn, False, True)

    @cute.jit
    def stage_tile(self, acc, region, cols: cutlass.Constexpr, ctid):
        # recast_ptr drops the bf16 tile's swizzle: the bulk copy reads a linear run.
        sAcc = cute.make_tensor(cute.recast_ptr(region.iterator, dtype=cutlass.Float32),
                                dq_frag_layout(self.tile_n, cols))
        # 16-byte stores, consecutive threads on consecutive 16 bytes: no bank conflicts.
        cute.autovec_copy(dq_frag_view(acc), sAcc[None, ctid])

    @cute.jit
    def bulk_add_staged(self, staged, ctid, sem, turn, take: cutlass.Constexpr, release: cutlass.Constexpr):
        """One thread issues the staged tiles' bulk reductions (deterministic: after taking the turn
        where ``take``, a first turn storing, and releasing it where ``release`` once they are
        performed) and waits until they have read shared memory."""
        # The generic-proxy stores, then the async proxy's reads.
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=BAR_EPI, number_of_threads=NUM_CONSUMER_THREADS)
        if ctid == 0:
            if cutlass.const_expr(self.deterministic):
                if cutlass.const_expr(take):
                    semaphore.wait_turn(sem, turn, True)
                # The previous turn's sums were written by the async proxy: order ours after them.
                cute.arch.fence_proxy("async.global")
            for region, cols, g in staged:
                src = cute.recast_ptr(region.iterator, dtype=cutlass.Float32)
                if cutlass.const_expr(self.deterministic):
                    if turn == 0:
                        semaphore.bulk_store_f32(g.iterator, src, self.tile_n * cols * 4)
                    else:
                        semaphore.bulk_reduce_add_f32(g.iterator, src, self.tile_n * cols * 4)
                else:
                    semaphore.bulk_reduce_add_f32(g.iterator, src, self.tile_n * cols * 4)
            cute.arch.cp_async_bulk_commit_group()
            if cutlass.const_expr(self.deterministic):
                # The next turn may only start once ours are performed, not just read.
                cute.arch.cp_async_bulk_wait_group(0, read=False)
                cute.arch.fence_proxy("async.global")
                if cutlass.const_expr(release):
                    semaphore.pass_turn(sem, True)
            else:
                # Shared memory lives as long as a thread of the CTA does: kept until the reductions read it.
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def sum_tiles(self, dkv_thr, dv_thr, acc_dK, acc_dV, gdK, gdV, n_block, seqlen_k, d: cutlass.Constexpr,
                  dv: cutlass.Constexpr, store: cutlass.Constexpr):
        """This CTA's dK/dV tiles into the fp32 sums: relaxed adds, or stores (a first turn)."""
        if cutlass.const_expr(self.qm):
            # dK^T / dV^T fragments (qm_tile_n): a key tile of 96 or 48 rows can run past the
            # accumulator's rows (padded to SEQ_PAD, not to the tile): keys past seqlen_k are
            # left out.
            cK = cute.local_tile(cute.make_identity_tensor((seqlen_k, d)), (self.tile_n, d), (n_block, 0))
            cV = cute.local_tile(cute.make_identity_tensor((seqlen_k, dv)), (self.tile_n, dv), (n_block, 0))
            self.red_tile(acc_as_rows_cols(acc_dK), acc_as_rows_cols(dkv_thr.partition_C(self.kv_view(gdK))),
                          False, acc_as_rows_cols(dkv_thr.partition_C(self.kv_view(cK))), seqlen_k, store)
            self.red_tile(acc_as_rows_cols(acc_dV), acc_as_rows_cols(dv_thr.partition_C(self.kv_view(gdV))),
                          False, acc_as_rows_cols(dv_thr.partition_C(self.kv_view(cV))), seqlen_k, store)
        else:
            self.red_tile(acc_as_rows_cols(acc_dK), acc_as_rows_cols(dkv_thr.partition_C(gdK)), self.kv_v2,
                          store=store)
            self.red_tile(acc_as_rows_cols(acc_dV), acc_as_rows_cols(dv_thr.partition_C(gdV)), self.kv_v2,
                          store=store)

    @cute.jit
    def finish_in_kernel(self, dkv_thr, dv_thr, acc_dK, acc_dV, gdK, gdV, mdKout, mdVout, mSemKV, ctid, n_block,
                         head, head_kv, batch, qhead_per_kvhead, seq):
        """gqa_finish 'last_cta': of the group's CTAs on this (key tile, K/V head), the first stores its
        fp32 tiles (the sums are not zeroed), the middle ones add theirs, the last reads the sums, adds
        its own in registers and writes dK/dV in the output dtype (rows past seqlen_k dropped). The
        order is the arrival order (a ticket), or deterministic the head order of the turns: one fixed
        order of fp32 additions, as the postprocess path's."""
        sem = mSemKV[batch, head_kv, None].iterator + n_block
        leader = ctid == 0
        first = Int32(0)
        last = Int32(0)
        if cutlass.const_expr(self.deterministic):
            turn = head - head_kv * qhead_per_kvhead
            semaphore.wait_turn(sem, turn, leader)
            cute.arch.barrier(barrier_id=BAR_SEM, number_of_threads=NUM_CONSUMER_THREADS)
            first = Int32(turn == 0)
            last = Int32(turn == qhead_per_kvhead - 1)
        else:
            ticket = semaphore.take_ticket(sem, qhead_per_kvhead, leader)
            # Two barriers that carry the leader's verdicts to the consumers: the second also
            # orders every thread's accesses after the leader's wait.
            first = semaphore.barrier_or(BAR_SEM, NUM_CONSUMER_THREADS, Int32(ticket == 0))
            last = semaphore.barrier_or(BAR_SEM, NUM_CONSUMER_THREADS, Int32(ticket == qhead_per_kvhead - 1))
        tdKg = dkv_thr.partition_C(gdK)
        tdVg = dv_thr.partition_C(gdV)
        if first != 0:
            for i in cutlass.range_constexpr(cute.size(acc_dK)):
                tdKg[i] = acc_dK[i]
            for i in cutlass.range_constexpr(cute.size(acc_dV)):
                tdVg[i] = acc_dV[i]
        elif last != 0:
            for i in cutlass.range_constexpr(cute.size(acc_dK)):
                acc_dK[i] = acc_dK[i] + tdKg[i]
            for i in cutlass.range_constexpr(cute.size(acc_dV)):
                acc_dV[i] = acc_dV[i] + tdVg[i]
            self.store_dkv_rows(dkv_thr, dv_thr, acc_dK, acc_dV, mdKout, mdVout, n_block, head_kv, batch, seq)
        else:
            self.red_tile(acc_as_rows_cols(acc_dK), acc_as_rows_cols(tdKg), self.kv_v2)
            self.red_tile(acc_as_rows_cols(acc_dV), acc_as_rows_cols(tdVg), self.kv_v2)
        if last == 0:
            # Every thread's stores or adds precede the leader's release (pass_turn's fence).
            cute.arch.barrier(barrier_id=BAR_SEM, number_of_threads=NUM_CONSUMER_THREADS)
            semaphore.pass_turn(sem, leader, 1 if self.deterministic else semaphore.DONE)

    def kv_view(self, t: cute.Tensor) -> cute.Tensor:
        """A (keys, head dim) tile as the dK/dV accumulators index it: transposed with qm_tile_n,
        whose accumulators are dK^T and dV^T."""
        return transpose_view(t) if self.qm else t

    @cute.jit
    def red_tile(self, r_mn: cute.Tensor, g_mn: cute.Tensor, v2: cutlass.Constexpr, c_mn=None, key_limit=None,
                 store: cutlass.Constexpr = False):
        """Add a register tile (rows/cols view) into global fp32 memory with relaxed reductions (with
        ``store``: plain stores, a deterministic first turn); with ``c_mn`` (the same view of (key,
        column) coordinates) only keys below ``key_limit``."""
        nrow = cute.size(r_mn, mode=[0])
        ncol = cute.size(r_mn, mode=[1])
        base = g_mn.iterator
        one = semaphore.st_f32 if store else semaphore.red_add_f32
        two = semaphore.st_f32x2 if store else semaphore.red_add_f32x2
        for r in cutlass.range_constexpr(nrow):
            if cutlass.const_expr(c_mn is not None):
                for c in cutlass.range_constexpr(ncol):
                    if c_mn[r, c][0] < key_limit:
                        one(base + cute.crd2idx((r, c), g_mn.layout), r_mn[r, c])
            elif cutlass.const_expr(v2):
                # Columns 2k and 2k+1 of an accumulator row are adjacent in memory.
                for c in cutlass.range_constexpr(ncol // 2):
                    off = cute.crd2idx((r, 2 * c), g_mn.layout)
                    two(base + off, r_mn[r, 2 * c], r_mn[r, 2 * c + 1])
            else:
                for c in cutlass.range_constexpr(ncol):
                    one(base + cute.crd2idx((r, c), g_mn.layout), r_mn[r, c])

    @cute.jit
    def store_dkv_rows(self, dkv_thr, dv_thr, acc_dK, acc_dV, mdK, mdV, n_block, head_kv, batch, seq):
        """dK/dV element by element from the fragment, rows past seqlen_k dropped (dkv_store
        'direct', and varlen's partial tiles)."""
        d, dv = self.head_dim, self.head_dim_v
        off_k, seqlen_k = seq[1], seq[3]
        # (batch, seqlen_k, heads_kv, d) in the input dtype; rows past seqlen_k are dropped
        # (varlen: past the sequence's keys, the next sequence's rows).
        if cutlass.const_expr(self.varlen):
            mdK = cute.domain_offset((0, off_k, 0, 0), mdK)
            mdV = cute.domain_offset((0, off_k, 0, 0), mdV)
            batch = 0
        gdK = cute.local_tile(mdK[batch, None, head_kv, None], (self.tile_n, d), (n_block, 0))
        gdV = cute.local_tile(mdV[batch, None, head_kv, None], (self.tile_n, dv), (n_block, 0))
        cD = cute.local_tile(cute.make_identity_tensor((seqlen_k, d)), (self.tile_n, d), (n_block, 0))
        tcD = dkv_thr.partition_C(self.kv_view(cD))
        tdKg = dkv_thr.partition_C(self.kv_view(gdK))
        tdVg = dv_thr.partition_C(self.kv_view(gdV))
        rdK = cute.make_rmem_tensor_like(acc_dK, self.dtype)
        rdV = cute.make_rmem_tensor_like(acc_dV, self.dtype)
        rdK.store(acc_dK.load().to(self.dtype))
        rdV.store(acc_dV.load().to(self.dtype))
        if cutlass.const_expr(dv == d):
            for i in cutlass.range_constexpr(cute.size(rdK)):
                if tcD[i][0] < seqlen_k:
                    tdKg[i] = rdK[i]
                    tdVg[i] = rdV[i]
        else:
            tcDv = dv_thr.partition_C(self.kv_view(
                cute.local_tile(cute.make_identity_tensor((seqlen_k, dv)), (self.tile_n, dv), (n_block, 0))
            ))
            for i in cutlass.range_constexpr(cute.size(rdK)):
                if tcD[i][0] < seqlen_k:
                    tdKg[i] = rdK[i]
            for i in cutlass.range_constexpr(cute.size(rdV)):
                if tcDv[i][0] < seqlen_k:
                    tdVg[i] = rdV[i]

    @cute.jit
    def store_dkv_tma(self, dkv_mma, acc_dK, acc_dV, mdK, mdV, sK, sV, tma_dkv, ctid, n_block, head_kv, batch, dv_mma):
        """dK/dV through the K/V shared tiles and one TMA store each (dkv_store 'tma')."""
        tma_dk, tma_dv = tma_dkv[0], tma_dkv[1]
        rdK = cute.make_rmem_tensor_like(acc_dK, self.dtype)
        rdV = cute.make_rmem_tensor_like(acc_dV, self.dtype)
        rdK.store(acc_dK.load().to(self.dtype))
        rdV.store(acc_dV.load().to(self.dtype))
        # Both consumers' last GEMMs read sK and sV (dQ = dS K reads every key row): both must be
        # done before either overwrites them.
        cute.arch.barrier(barrier_id=BAR_EPI, number_of_threads=NUM_CONSUMER_THREADS)
        if cutlass.const_expr(self.qm):
            self.store_dkv_t_smem(dkv_mma, dv_mma, rdK, rdV, sK, sV, ctid)
        else:
            # A thread's accumulator holds two adjacent head_dim columns of a key row per 8x8 block:
            # the stmatrix register order, 16-byte rows of the K-major tile.
            st = cute.make_tiled_copy_C(
                cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), dkv_mma
            )
            st_thr = st.get_slice(ctid)
            cute.copy(st, st_thr.retile(rdK), st_thr.partition_D(sK[None, None, 0]))
            if cutlass.const_expr(dv_mma is not dkv_mma):
                st = cute.make_tiled_copy_C(
                    cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), dv_mma
                )
                st_thr = st.get_slice(ctid)
            cute.copy(st, st_thr.retile(rdV), st_thr.partition_D(sV[None, None, 0]))
        # Generic-proxy stores, read by the TMA engine (async proxy).
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=BAR_EPI, number_of_threads=NUM_CONSUMER_THREADS)
        if ctid == 0:
            tKs, tKg = seq_tiles(tma_dk, mdK, sK, (self.tile_n, self.head_dim), head_kv, batch)
            tVs, tVg = seq_tiles(tma_dv, mdV, sV, (self.tile_n, self.head_dim_v), head_kv, batch)
            cute.copy(tma_dk, tKs[None, 0], tKg[None, n_block])
            cute.copy(tma_dv, tVs[None, 0], tVg[None, n_block])
            cute.arch.cp_async_bulk_commit_group()
            # Shared memory must stay valid until the engine has read it (the CTA exits next).
            cute.arch.cp_async_bulk_wait_group(0, read=True)
