"""qm_tile_n: the wide-head tiling of the Hopper backward (a FlashBwdSm90 mixin, fa4.sm90.bwd).

At head_dim 192/256 a consumer thread cannot hold dK and dV over all of head_dim for 64 key rows
(dkv_split 'keys'), so dkv_split 'head_dim' (fa4.sm90.bwd_split) shares one 64-key tile between
the two consumers: every Q/dO tile the producer loads serves 64 keys, and the step is bound by
shared-memory reads (session 15: 33.6 KB per MFLOP at hd192). This layout, the reference FA4's
at these head dims, serves tile_n keys (96 at hd192) per load instead:

    S  = Q K^T,  dP = dO V^T  (SS; the 64 queries on M, warpgroup w the keys [w tile_n/2, ...) on N)
    P  = exp2(S scale log2e - LSE),  dS = P (dP - D)      (two query rows a thread: the forward's
                                                           row statistics and masks)
    P, dS -> shared memory (keys contiguous), one barrier of both consumers
    dV^T += dO^T P,  dK^T += Q^T dS   (SS, swap-AB: the head dim on M; the two consumers split the
                                       keys on N, or at 256 the head dim on M: dkv_on_m)
    dQ    = dS K                      (SS, dS K-major; each warpgroup half of head_dim, as before)

dK^T and dV^T hold tile_n x (d + dv) fp32 over the 256 consumers: 144 registers a thread at hd192
with 96 keys, against 192 for 128 keys on M. dQ's accumulator has the fragment order of
dq_split 'head_dim' (only A's major mode differs), so the dQ writer warps, the accumulator format
and the postprocess are shared; the producer, the schedule and the semaphores take tile_n as it is.

Not built with it: cluster_exchange (bwd_config.qm_violations).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32
from cutlass.cute.nvgpu import warp, warpgroup

from fa4.common import masking, mma, softcap_bwd
from fa4.common.exp2 import exp2_mufu
from fa4.common.layout import acc_as_rows_cols, transpose_view
from fa4.common.regs import opaque
from fa4.sm90 import bwd_split
from fa4.sm90.bwd_dq import BAR_DS_FREE, BAR_DS_FULL, NUM_CONSUMER_THREADS
from fa4.sm90.bwd_prepost import make_dq_mma

WGS = 2
ATOM_M = 64  # WGMMA M


def dkv_on_m(head_dim: int, head_dim_v: int) -> bool:
    """dK^T / dV^T: the two consumers split the head dim (M) where both are whole pairs of 64-row
    WGMMA atoms (256), so each issues the full tile_n keys as N; 192 is three atoms, and there
    they split the keys."""
    return head_dim % (WGS * ATOM_M) == 0 and head_dim_v % (WGS * ATOM_M) == 0


def make_mmas(dtype, tile_m: int, tile_n: int, head_dim: int, head_dim_v: int):
    """(sdp_mma, dk_mma, dv_mma, dq_mma) of the layout."""
    kmaj = cute.nvgpu.OperandMajorMode.K
    mnmaj = cute.nvgpu.OperandMajorMode.MN
    # S = Q K^T and dP = dO V^T: A = Q / dO, B = K / V, all head-dim contiguous (K-major).
    sdp = sm90_utils.make_trivial_tiled_mma(dtype, dtype, kmaj, kmaj, Float32, (1, WGS, 1), (tile_m, tile_n // WGS))
    if dkv_on_m(head_dim, head_dim_v):
        atoms, n = (WGS, 1, 1), tile_n
    else:
        atoms, n = (1, WGS, 1), tile_n // WGS
    # dK^T += Q^T dS, dV^T += dO^T P: A = Q^T / dO^T (head dim contiguous), B = dS^T / P^T (keys
    # contiguous): both MN-major reads of the tiles as stored.
    dk = sm90_utils.make_trivial_tiled_mma(dtype, dtype, mnmaj, mnmaj, Float32, atoms, (ATOM_M, n))
    dv = dk
    if head_dim_v != head_dim:
        dv = sm90_utils.make_trivial_tiled_mma(dtype, dtype, mnmaj, mnmaj, Float32, atoms, (ATOM_M, n))
    return sdp, dk, dv, make_dq_mma(dtype, head_dim, "head_dim", ds_key_major=True)


def make_layouts(kernel):
    """(sQ, sdO, sK, sV, sdS, sP) shared-memory layouts. Every 16-bit tile is stored row-major as
    TMA or the stmatrix stores write it; the swizzle atom is narrowed where another GEMM reads a
    tile MN-major in slices (bwd_split.swizzle_width): K in dQ's head-dim halves, dS and P in
    the dK^T/dV^T B slices of each warpgroup's keys."""
    d, dv, tm, tn, dt = kernel.head_dim, kernel.head_dim_v, kernel.tile_m, kernel.tile_n, kernel.dtype
    # dS and P: each warpgroup stores tile_n/2 keys of S's columns and (dkv_on_m or not) reads at
    # most that many a B slice of dK^T/dV^T; an atom must tile a warpgroup's S columns, or the
    # store's partition does not exist (qm_tile_n 48: 24 keys, an 8-element atom).
    key_slice = tn // WGS
    sQ = bwd_split.k_major_layout("a", (tm, tn, d), dt, kernel.q_stages, ATOM_M)
    sdO = bwd_split.k_major_layout("a", (tm, tn, dv), dt, kernel.do_stages, ATOM_M)
    sK = bwd_split.k_major_layout("b", (tm, tn, d), dt, 1, d // WGS)
    sV = bwd_split.k_major_layout("b", (tm, tn, dv), dt, 1, dv)
    sdS = bwd_split.k_major_layout("a", (tm, tn, tn), dt, kernel.ds_stages, key_slice)
    sP = bwd_split.k_major_layout("a", (tm, tn, tn), dt, kernel.ds_stages, key_slice)
    return sQ, sdO, sK, sV, sdS, sP


class QmSteps:
    """The consumers' part of the layout (see the module docstring)."""

    @cute.jit
    def qm_setup(self, sdp_mma, dkv_mma, dv_mma, dq_mma, sQ, sdO, sK, sV, sdS, sP, sdQ, pipe_kv, ctid, n_block):
        """Fragments, accumulators and the thread's coordinates, after K and V have landed."""
        d, dv, tm, tn = self.head_dim, self.head_dim_v, self.tile_m, self.tile_n
        sdp_thr = sdp_mma.get_slice(ctid)
        dkv_thr = dkv_mma.get_slice(ctid)
        dv_thr = dv_mma.get_slice(ctid)
        dq_thr = dq_mma.get_slice(ctid)
        # Shared-memory operands sliced at the warpgroup's first thread (fa4.common.mma.wg_slices).
        sdp_wg, dkv_wg, dq_wg, dv_wg = mma.wg_slices(ctid, sdp_mma, dkv_mma, dq_mma, dv_mma)
        tSrQ = sdp_wg.make_fragment_A(sdp_wg.partition_A(sQ))  # (MMA, 1, d/16, q_stages)
        tSrK = sdp_wg.make_fragment_B(sdp_wg.partition_B(sK))  # (MMA, 1, d/16, 1)
        tdPrdO = sdp_wg.make_fragment_A(sdp_wg.partition_A(sdO))
        tdPrV = sdp_wg.make_fragment_B(sdp_wg.partition_B(sV))
        tdVrdOt = dv_wg.make_fragment_A(dv_wg.partition_A(transpose_view(sdO)))  # (MMA, dv/.., m/16, do_stages)
        tdVrPt = dv_wg.make_fragment_B(dv_wg.partition_B(transpose_view(sP)))  # (MMA, .., m/16, ds_stages)
        tdKrQt = dkv_wg.make_fragment_A(dkv_wg.partition_A(transpose_view(sQ)))
        tdKrdSt = dkv_wg.make_fragment_B(dkv_wg.partition_B(transpose_view(sdS)))
        tdQrdS = dq_wg.make_fragment_A(dq_wg.partition_A(sdS))  # (MMA, 1, n/16, ds_stages)
        tdQrKt = dq_wg.make_fragment_B(dq_wg.partition_B(transpose_view(sK)))

        acc_S = sdp_thr.make_fragment_C(sdp_thr.partition_shape_C((tm, tn)))
        acc_dP = sdp_thr.make_fragment_C(sdp_thr.partition_shape_C((tm, tn)))
        acc_dV = dv_thr.make_fragment_C(dv_thr.partition_shape_C((dv, tn)))  # dV^T
        acc_dK = dkv_thr.make_fragment_C(dkv_thr.partition_shape_C((d, tn)))  # dK^T
        acc_dQ = dq_thr.make_fragment_C(dq_thr.partition_shape_C((tm, d)))
        # 16-bit P and dS in the accumulator layout, for the stores into sP and sdS.
        rP = cute.make_rmem_tensor_like(acc_S, self.dtype)
        rdS = cute.make_rmem_tensor_like(acc_dP, self.dtype)
        cS = cute.make_identity_tensor((tm, tn))
        # Static (query, key) offsets of thread 0 (fa4.common.masking) and this thread's first.
        c0_mn = acc_as_rows_cols(sdp_mma.get_slice(0).partition_C(cS))
        q0, k0 = acc_as_rows_cols(sdp_thr.partition_C(cS))[0, 0]
        acc_dV.fill(0.0)
        acc_dK.fill(0.0)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        pipe_kv.consumer_wait(kv_state)
        frag = (tSrQ, tSrK, tdPrdO, tdPrV, tdVrdOt, tdVrPt, tdKrQt, tdKrdSt, tdQrdS, tdQrKt, sdS, sP, sdQ)
        accs = (acc_S, acc_dP, acc_dV, acc_dK, acc_dQ, rP, rdS, acc_as_rows_cols(acc_S), acc_as_rows_cols(acc_dP))
        # The step's mask takes the thread's first key of the CTA's tile (the limits slot).
        return frag, accs, c0_mn, q0, n_block * tn + k0, dkv_thr, dv_thr, dq_thr

    @cute.jit
    def step_qm(
        self, sdp_mma, dkv_mma, dv_mma, dq_mma, dq_thr, frag, accs, c0_mn, q0, key_base, sLSE, sDsum, mdQacc,
        mSemQ, pipe_q, pipe_do, step_base, ctid, m, n_block, head, batch, num_n,
        seqlen_q, seqlen_k, scale_log2, spt, win, softcap_args, seq, masked: cutlass.Constexpr,
    ):
        """One query tile m: the step of FlashBwdSm90.step with the queries on M."""
        tSrQ, tSrK, tdPrdO, tdPrV, tdVrdOt, tdVrPt, tdKrQt, tdKrdSt, tdQrdS, tdQrKt, sdS, sP, sdQ = frag
        acc_S, acc_dP, acc_dV, acc_dK, acc_dQ, rP, rdS, s_mn, dp_mn = accs
        nrow = cute.size(s_mn, mode=[0])
        ncol = cute.size(s_mn, mode=[1])
        # Ring positions from the step number (no state carried across iterations); Q and dO
        # may have rings of different depths (do_single).
        i = m - step_base
        q_state = pipeline.PipelineState(self.q_stages, i, i % self.q_stages, (i // self.q_stages) % 2)
        do_state = q_state
        if cutlass.const_expr(self.do_stages != self.q_stages):
            do_state = pipeline.PipelineState(self.do_stages, i, i % self.do_stages, (i // self.do_stages) % 2)
        ds_buf = i % self.ds_stages
        dp = (sdp_mma, acc_dP, tdPrdO, do_state.index, tdPrV, 0)
        if cutlass.const_expr(self.dp_first):
            self.gemm_dp(pipe_do, do_state, dp)
        pipe_q.consumer_wait(q_state)
        mma.gemm(sdp_mma, acc_S, tSrQ[None, None, None, q_state.index], tSrK[None, None, None, 0], zero_init=True)
        warpgroup.commit_group()
        # Two query rows a thread: their statistics go to registers while the GEMMs run.
        tLSE = cute.make_rmem_tensor((nrow,), Float32)
        for r in cutlass.range_constexpr(nrow):
            tLSE[r] = sLSE[q0 + c0_mn[r, 0][0], q_state.index]
        if cutlass.const_expr(not self.dp_first):
            self.gemm_dp(pipe_do, do_state, dp)
        warpgroup.wait_group(0 if self.dp_first else 1)
        tDsum = cute.make_rmem_tensor((nrow,), Float32)
        for r in cutlass.range_constexpr(nrow):
            tDsum[r] = sDsum[q0 + c0_mn[r, 0][0], do_state.index]
        if cutlass.const_expr(self.has_softcap):
            # t = tanh(S scale / c) under the dP GEMM; the mask after it (tanh(-inf) = -1 would be
            # a visible score); P and dS from t in one loop after dP.
            softcap_inv, softcap_log2 = softcap_args
            softcap_bwd.tanh_scores(s_mn, softcap_inv)
            if cutlass.const_expr(masked):
                self.apply_mask_qm(s_mn, c0_mn, m * self.tile_m + q0, key_base, seqlen_q, seqlen_k, win)
            self.wait_dp(s_mn, seqlen_k)
            for r in cutlass.range_constexpr(nrow):
                for c in cutlass.range_constexpr(ncol):
                    t = s_mn[r, c]
                    p = exp2_mufu(t * softcap_log2 - tLSE[r])
                    s_mn[r, c] = p
                    dp_mn[r, c] = p * (dp_mn[r, c] - tDsum[r]) * softcap_bwd.dtanh(t)
        else:
            if cutlass.const_expr(masked):
                self.apply_mask_qm(s_mn, c0_mn, m * self.tile_m + q0, key_base, seqlen_q, seqlen_k, win)
            for r in cutlass.range_constexpr(nrow):
                for c in cutlass.range_constexpr(ncol):
                    s_mn[r, c] = exp2_mufu(s_mn[r, c] * scale_log2 - tLSE[r])
            self.wait_dp(s_mn, seqlen_k)
            for r in cutlass.range_constexpr(nrow):
                for c in cutlass.range_constexpr(ncol):
                    dp_mn[r, c] = s_mn[r, c] * (dp_mn[r, c] - tDsum[r])
        rP.store(acc_S.load().to(self.dtype))
        rdS.store(acc_dP.load().to(self.dtype))
        # P and dS (rows queries, keys contiguous) for both consumers: the stmatrix order of the
        # accumulator, as the forward's P (fa4.sm90.bwd_split.publish_p_ds).
        self.publish_p_ds(sdp_mma, rP, rdS, sP, sdS, ds_buf, ctid, BAR_DS_FREE, BAR_DS_FULL,
                          NUM_CONSUMER_THREADS)
        self.gemms_dv_dq_dk(
            (dv_mma, acc_dV, tdVrdOt, do_state.index, tdVrPt, ds_buf),
            (dkv_mma, acc_dK, tdKrQt, q_state.index, tdKrdSt, ds_buf),
            (dq_mma, acc_dQ, tdQrdS, ds_buf, tdQrKt, 0),
        )
        self.step_tail(acc_dQ, sdQ, mdQacc, mSemQ, pipe_q, q_state, pipe_do, do_state, None, ds_buf, ctid, i, m,
                       n_block, head, batch, num_n, seqlen_q, seqlen_k, spt, win, seq)

    @cute.jit
    def apply_mask_qm(self, s_mn, c0_mn, row_base, key_base, seqlen_q, seqlen_k, win):
        """The S tile's mask, rows queries: the forward's (fa4.common.masking.apply_mask)."""
        masking.apply_mask(s_mn, c0_mn, row_base, key_base, seqlen_q, seqlen_k, self.causal, self.has_window_left,
                           self.has_window_right, win[0], win[1], self.config.mask_bits)

    @cute.jit
    def store_dkv_t_smem(self, dkv_mma, dv_mma, rdK, rdV, sK, sV, ctid):
        """16-bit dK^T / dV^T fragments into the K / V shared tiles (keys x head dim, head dim
        contiguous): a thread holds two adjacent keys of one head-dim row per 8x8 block, the
        transposed stmatrix order of those tiles."""
        st = cute.make_tiled_copy_C(
            cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype), dkv_mma
        )
        st_thr = st.get_slice(opaque(ctid))
        cute.copy(st, st_thr.retile(rdK), st_thr.partition_D(transpose_view(sK)[None, None, 0]))
        if cutlass.const_expr(dv_mma is not dkv_mma):
            st = cute.make_tiled_copy_C(
                cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype), dv_mma
            )
            st_thr = st.get_slice(opaque(ctid))
        cute.copy(st, st_thr.retile(rdV), st_thr.partition_D(transpose_view(sV)[None, None, 0]))
