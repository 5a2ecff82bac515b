"""Softcap in the backward: the recomputed scores' tanh and its derivative.

Forward (fa4.common.softcap, the reference's convention): the score s = q.k * softmax_scale
becomes c * tanh(s / c) before the softmax, so with t = tanh(q.k * softmax_scale / c)

    P      = exp2(t * c * log2(e) - LSE * log2(e))
    dS_raw = P * (dP - D) * (1 - t^2)            (the gradient w.r.t. q.k, before softmax_scale)

The host passes softcap_inv = softmax_scale / c and softcap_log2 = c * log2(e). t is kept in
the S accumulator between the two loops (one MUFU.TANH and one MUFU.EX2 per element), and
(1 - t^2) is taken from the same t, no second tanh.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32


@cute.jit
def tanh_scores(s_mn: cute.Tensor, softcap_inv: Float32):
    """In place: t = tanh(s * softcap_inv) for a (rows, cols) register view (MUFU.TANH)."""
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
            s_mn[r, c] = cute.math.tanh(s_mn[r, c] * softcap_inv, fastmath=True)


@cute.jit
def dtanh(t: Float32) -> Float32:
    """1 - t^2; a masked t (-inf) gives 0, not -inf (P is 0 there, and 0 * -inf would be NaN)."""
    tc = cutlass.max(t, Float32(-1.0))
    return Float32(1.0) - tc * tc


def host_args(softmax_scale: float, softcap: float) -> tuple[float, float]:
    """(softcap_inv, softcap_log2) of the kernel for softcap c > 0; (0, 0) without softcap."""
    import math

    if softcap <= 0:
        return 0.0, 0.0
    return softmax_scale / softcap, softcap * math.log2(math.e)
