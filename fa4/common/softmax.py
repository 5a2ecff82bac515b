"""Online softmax over WGMMA accumulator rows, with the FA4 knobs.

* Conditional rescaling (tau): the running max ``row_max`` used to exponentiate is
  only moved when some row of the warp sees the true max exceed it by more than
  ``tau`` (log2 units of the scaled score). Otherwise P may exceed 1 (by at most
  2^tau) and O, the row sum and the max all stay as they are, which skips the O
  rescale (one FMUL per O element) on the critical path. The decision is a warp
  vote, so the skip is a uniform branch, never divergence. Since the row sum is
  accumulated with the same ``row_max`` as O, the final O / row_sum is exact.
* exp2 split: a compile-time subset of each thread's row elements is evaluated by
  the FMA-pipe polynomial (fa4.common.exp2), the rest by MUFU.EX2, so the two
  units work in parallel.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from fa4.common.exp2 import exp2_mufu, exp2_poly


@cute.jit
def _quad_max(x: Float32) -> Float32:
    # The 4 threads of a quad hold the same two rows of a WGMMA accumulator.
    return cute.arch.warp_reduction_max(x, threads_in_group=4)


@cute.jit
def _exp2_row(
    s_mn: cute.Tensor,  # ((2, MMA_M), (2, V, MMA_N)) scores, overwritten with P
    r: cutlass.Constexpr,
    scale_log2: Float32,
    m_scaled: Float32,
    emulated: cutlass.Constexpr,  # frozenset of column indices done on the FMA pipe
) -> Float32:
    ncol = cute.size(s_mn, mode=[1])
    # Four independent partial sums: one serial FADD chain over the row would put its
    # latency (ncol x 4 cycles) on the softmax critical path.
    parts = [Float32(0.0), Float32(0.0), Float32(0.0), Float32(0.0)]
    for c in cutlass.range_constexpr(ncol):
        x = s_mn[r, c] * scale_log2 - m_scaled
        if cutlass.const_expr(c in emulated):
            p = exp2_poly(x)
        else:
            p = exp2_mufu(x)
        s_mn[r, c] = p
        parts[c % 4] = parts[c % 4] + p
    return (parts[0] + parts[1]) + (parts[2] + parts[3])


def _tree(vals, op):
    """Reduce a static list of traced values as a balanced tree (plain Python: runs at trace time)."""
    vals = list(vals)
    while len(vals) > 1:
        nxt = [op(vals[i], vals[i + 1]) for i in range(0, len(vals) - 1, 2)]
        if len(vals) % 2:
            nxt.append(vals[-1])
        vals = nxt
    return vals[0]


MAX_CHAINS = 4


def _row_max(s_mn: cute.Tensor, r: int, init) -> Float32:
    """Max over a thread's part of row r: MAX_CHAINS interleaved fmax chains, then a tree.

    Not one balanced tree over the row: ptxas issues its whole first level up front, and the
    temporaries are live at the consumer's register peak (S(j) complete, O and P(j-1) held by
    the in-flight PV): 3 registers more than chains at hd64 tile_n 128 (peak 152 vs 149 of
    160). fmax is exact and order-free, so the result is the same.
    """
    ncol = cute.size(s_mn, mode=[1])
    k = min(MAX_CHAINS, ncol)
    chains = [s_mn[r, c] for c in range(k)]
    for c in range(k, ncol):
        chains[c % k] = cute.arch.fmax(chains[c % k], s_mn[r, c])
    if init is not None:
        chains.append(init)
    return _tree(chains, cute.arch.fmax)


@cute.jit
def softmax_first(
    s_mn: cute.Tensor,
    row_max: cute.Tensor,  # (rows,) fp32, raw-score units
    row_sum: cute.Tensor,  # (rows,) fp32, this thread's partial sums
    scale_log2: Float32,
    emulated: cutlass.Constexpr,
):
    nrow = cute.size(s_mn, mode=[0])
    for r in cutlass.range_constexpr(nrow):
        m = _quad_max(_row_max(s_mn, r, None))
        row_max[r] = m
        # A row with every key masked so far has max -inf; exponentiate against 0 so
        # that exp2(-inf) = 0 instead of exp2(NaN).
        m_scaled = m * scale_log2
        if m == -Float32.inf:
            m_scaled = Float32(0.0)
        row_sum[r] = _exp2_row(s_mn, r, scale_log2, m_scaled, emulated)


@cute.jit
def softmax_next(
    s_mn: cute.Tensor,
    row_max: cute.Tensor,
    row_sum: cute.Tensor,
    row_scale: cute.Tensor,  # (rows,) out: factor to apply to O rows
    scale_log2: Float32,
    tau: Float32,
    emulated: cutlass.Constexpr,
):
    """One KV tile of online softmax. Returns whether O must be rescaled (warp-uniform)."""
    nrow = cute.size(s_mn, mode=[0])
    need = cutlass.Boolean(False)
    m_new = cute.make_rmem_tensor_like(row_max, Float32)
    for r in cutlass.range_constexpr(nrow):
        m = _quad_max(_row_max(s_mn, r, row_max[r]))
        m_new[r] = m
        # NaN (both -inf) compares false: nothing to rescale.
        need = need | ((m - row_max[r]) * scale_log2 > tau)
    need = cute.arch.vote_any_sync(need)
    for r in cutlass.range_constexpr(nrow):
        row_scale[r] = Float32(1.0)
    if need:
        for r in cutlass.range_constexpr(nrow):
            m = m_new[r]
            f = Float32(1.0)
            if m != -Float32.inf:
                f = exp2_mufu((row_max[r] - m) * scale_log2)
            row_scale[r] = f
            row_sum[r] = row_sum[r] * f
            row_max[r] = m
    for r in cutlass.range_constexpr(nrow):
        m_scaled = row_max[r] * scale_log2
        if row_max[r] == -Float32.inf:
            m_scaled = Float32(0.0)
        row_sum[r] = row_sum[r] + _exp2_row(s_mn, r, scale_log2, m_scaled, emulated)
    return need


@cute.jit
def rescale_rows(o_mn: cute.Tensor, row_scale: cute.Tensor):
    for r in cutlass.range_constexpr(cute.size(o_mn, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
            o_mn[r, c] = o_mn[r, c] * row_scale[r]


@cute.jit
def finalize(
    o_mn: cute.Tensor,
    row_max: cute.Tensor,
    row_sum: cute.Tensor,
    lse: cute.Tensor,  # (rows,) out: natural-log LSE of each row
    scale_log2: Float32,
    sink_log2: Float32 | None = None,  # learnable sink logit * log2(e), or None: no sink
):
    """O /= row_sum with the true final statistics; rows that saw no key give O = 0, LSE = -inf.

    A sink is one more softmax column (logit sink, no value): it joins the row sum as
    2^(sink log2 e - m scale_log2) against the same (possibly tau-stale) max as the other terms,
    and so the LSE, never O. A row that saw no key has the sink alone: O = 0, LSE = sink (as the
    reference FA4).
    """
    ln2 = 0.6931471805599453
    for r in cutlass.range_constexpr(cute.size(o_mn, mode=[0])):
        s = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
        m_scaled = row_max[r] * scale_log2
        if cutlass.const_expr(sink_log2 is not None):
            if row_max[r] == -Float32.inf:
                m_scaled = sink_log2
                s = Float32(1.0)
            else:
                s = s + exp2_mufu(sink_log2 - m_scaled)
        inv = Float32(0.0)
        lse[r] = -Float32.inf
        if s > Float32(0.0):
            inv = cute.arch.rcp_approx(s)
            lse[r] = (m_scaled + cute.math.log2(s, fastmath=True)) * ln2
        for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
            o_mn[r, c] = o_mn[r, c] * inv
