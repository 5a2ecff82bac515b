"""Bit-exact numpy model of ``tanh_fma`` in fa4/common/softcap.py, for CPU tests.

Each fp32 instruction of the device sequence with its rounding (the exp2 part is
fa4/common/exp2_model.py's with the degree-5 polynomial, minus the low clamp, which y >= 0 never
needs):

    abs + mul.rn.f32   y0 = fl(|x| k)
    min.f32            y  = min(y0, 64)
    add.rm.ftz / sub.rn x2 / fma.rn x5 / shl+add.s32   e = 2^y   (exp2_poly, degree 5)
    add.rn.f32         d  = e + 1
    sub.s32            q0 = bits(0x7EF311C3 - bits(d))
    fma.rn.f32 x2, 3 times err = 1 - d q;  q = q + q err
    fma.rn.f32         m  = 1 - 2 q
    and/or.b32         t  = m with x's sign bit

The two must change together.
"""

from __future__ import annotations

import numpy as np

from fa4.common.exp2_model import ROUND_MAGIC, add_f32, add_rm_ftz_f32, fma_f32

TWO_LOG2_E = np.float32(2.8853900817779268)
Y_MAX = np.float32(64.0)
RCP_MAGIC = 0x7EF311C3
NEWTON_STEPS = 3
TANH_EXP2_DEGREE = 5


def _exp2_nonneg(y: np.ndarray, degree: int = TANH_EXP2_DEGREE) -> np.ndarray:
    from fa4.common.exp2 import EXP2_POLY_COEFFS

    cs = [np.float32(c) for c in EXP2_POLY_COEFFS[degree]]
    r = add_rm_ftz_f32(y, ROUND_MAGIC)
    rb = add_f32(r, -ROUND_MAGIC)
    f = add_f32(y, -rb)
    p = np.full_like(f, cs[-1])
    for c in reversed(cs[:-1]):
        p = fma_f32(p, f, c)
    r_bits = r.view(np.uint32).astype(np.uint64)
    p_bits = p.view(np.uint32).astype(np.uint64)
    out = (((r_bits << np.uint64(23)) & np.uint64(0xFFFFFFFF)) + p_bits) & np.uint64(0xFFFFFFFF)
    return out.astype(np.uint32).view(np.float32)


def tanh_fma_model(x, k=TWO_LOG2_E, newton_steps: int = NEWTON_STEPS, degree: int = TANH_EXP2_DEGREE) -> np.ndarray:
    """The device ``tanh_fma(x, k)`` on fp32 inputs: tanh(x * k / (2 log2 e)), bit-exact (other
    ``newton_steps`` / exp2 ``degree``: the sequence with those, for the tests' what-ifs)."""
    x = np.asarray(x, dtype=np.float32)
    shape = x.shape
    x = x.reshape(-1)
    y = np.minimum(fma_f32(np.abs(x), np.float32(k), np.float32(0.0)), Y_MAX).astype(np.float32)
    e = _exp2_nonneg(y, degree)
    d = add_f32(e, np.float32(1.0))
    q = (np.int64(RCP_MAGIC) - d.view(np.int32).astype(np.int64)).astype(np.int32).view(np.float32)
    for _ in range(newton_steps):
        err = fma_f32(-d, q, np.float32(1.0))
        q = fma_f32(q, err, q)
    m = fma_f32(np.float32(-2.0), q, np.float32(1.0))
    bits = (m.view(np.uint32) & np.uint32(0x7FFFFFFF)) | (x.view(np.uint32) & np.uint32(0x80000000))
    return bits.astype(np.uint32).view(np.float32).reshape(shape)


def softcapped_scores_model(s, softmax_scale: float, softcap: float, fma: np.ndarray | None = None) -> np.ndarray:
    """c * t of the kernels' scores s = q.k (fp32): the capped score, FMA path where ``fma`` is True and
    exact tanh elsewhere (MUFU tanh.approx is not bit-exact; use it for tolerance checks)."""
    s = np.asarray(s, dtype=np.float32)
    scale = np.float32(softmax_scale / softcap)
    t = np.tanh((s * scale).astype(np.float64)).astype(np.float32)
    if fma is not None:
        t = np.where(fma, tanh_fma_model(s, np.float32(scale * TWO_LOG2_E)), t)
    return (np.float32(softcap) * t).astype(np.float32)
