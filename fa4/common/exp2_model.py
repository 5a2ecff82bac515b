"""Bit-exact numpy model of the device exp2 paths in fa4/common/exp2.py, for CPU tests.

Every fp32 instruction of `exp2_poly` is reproduced with its rounding mode:

    max.f32            xc = max(x, -127)           NaN -> -127, -inf -> -127
    add.rm.ftz.f32     r  = xc + 1.5 * 2^23        rounded toward -inf: floor(xc) lands in r's low bits
    sub.rn.f32         rb = r - 1.5 * 2^23         exact: both are integers below 2^24
    sub.rn.f32         f  = xc - rb                in [0, 1]; exact unless |xc| < 1 rounds up to 1.0
    fma.rn.f32 x3      p  = ((c3 f + c2) f + c1) f + 1
    shl.b32, add.s32   bits = (bits(r) << 23) + bits(p)   (int32, wrapping)

The last step works because bits(r) = 0x4B400000 + floor(xc) and the low 9 bits of 0x4B400000 are 0,
so the shift leaves exactly floor(xc) << 23, which adds floor(xc) to p's exponent field. p need not
lie in [1, 2): when f rounds to 1.0, p ~ 2 carries into the exponent and the sum is still 2^n * p.

Edge cases, as on the device:
- x = -inf (masked score) and NaN: clamp to -127, f = 0, p = 1, bits = 0x3F800000 - (127 << 23) = 0,
  i.e. exactly +0.0. (MUFU gives 0 for -inf and NaN for NaN.)
- -127 < x < -126: the exponent field becomes 0 and the result is the denormal (p - 1) * 2^-126,
  not 2^x; it stays below 2^-126 in magnitude (absolute error < 2^-126). MUFU's .ftz flushes that
  range to 0; both are far below anything bf16 softmax can see after the row max is subtracted.
- x >= 128 overflows the exponent into the sign bit. The kernel feeds x <= tau (a few units), and
  the polynomial is accurate for every x in [-126, 128).

Rounding emulation: an fp32 op is "round the exact result once". For add/sub/fma of fp32 operands the
exact result is s + e with s = fl64(a*b + c) and e its exact TwoSum error (a*b is exact in float64:
24 + 24 bits < 53, and fp32 magnitudes keep every term far from float64 under/overflow). Round-to-odd
of s + e to float64 followed by a round-to-nearest to fp32 equals a single correct rounding, because
53 >= 24 + 2 (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms
using rounding to odd", IEEE TC 2008). Plain fl32(fl64(a*b + c)) would double-round. Directed rounding
(add.rm) instead compares the fp32 candidate with s and the sign of e.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ROUND_MAGIC = np.float32(12582912.0)  # 1.5 * 2^23: the ulp at this magnitude is exactly 1
CLAMP_LO = np.float32(-127.0)
_F32_TINY = np.float32(2.0**-126)


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _two_sum(a: np.ndarray, b: np.ndarray):
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def _ftz(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) < _F32_TINY, np.copysign(np.float32(0.0), x), x).astype(np.float32)


def _round_exact_sum_rn(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """fp32 round-to-nearest-even of the exact value hi + lo (float64 operands)."""
    s, e = _two_sum(hi, lo)
    with np.errstate(invalid="ignore"):
        bits = s.view(np.int64)
        inexact_even = (e != 0) & ((bits & 1) == 0) & np.isfinite(s)
    toward = np.where(e > 0, np.inf, -np.inf)
    s_odd = np.where(inexact_even, np.nextafter(s, toward), s)
    with np.errstate(over="ignore"):
        return s_odd.astype(np.float32)


def _round_exact_sum_rm(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """fp32 round-toward-minus-infinity of the exact value hi + lo (float64 operands)."""
    s, e = _two_sum(hi, lo)
    with np.errstate(over="ignore"):
        t = s.astype(np.float32)
    t64 = t.astype(np.float64)
    too_big = (t64 > s) | ((t64 == s) & (e < 0))
    return np.where(too_big, np.nextafter(t, np.float32(-np.inf)), t).astype(np.float32)


def fma_f32(a, b, c) -> np.ndarray:
    """fma.rn.f32 (denormals kept, as without .ftz)."""
    a, b, c = (_f32(v).astype(np.float64) for v in (a, b, c))
    return _round_exact_sum_rn(a * b, c)


def add_f32(a, b) -> np.ndarray:
    """add.rn.f32 / sub.rn.f32 (pass -b)."""
    return _round_exact_sum_rn(_f32(a).astype(np.float64), _f32(b).astype(np.float64))


def add_rm_ftz_f32(a, b) -> np.ndarray:
    """add.rm.ftz.f32: denormal inputs and outputs flushed to (signed) zero."""
    a64 = _ftz(_f32(a)).astype(np.float64)
    b64 = _ftz(_f32(b)).astype(np.float64)
    return _ftz(_round_exact_sum_rm(a64, b64))


def exp2_poly_model(x, coeffs: Sequence[float] | None = None) -> np.ndarray:
    """The device `exp2_poly` sequence on fp32 inputs; returns fp32 (bit-exact to the device).

    coeffs = (1.0, c1, ..., cn) in fp32; defaults to the degree-3 constants of fa4/common/exp2.py.
    """
    if coeffs is None:
        from fa4.common.exp2 import EXP2_POLY

        coeffs = EXP2_POLY
    cs = [np.float32(c) for c in coeffs]
    if cs[0] != np.float32(1.0):
        raise ValueError("the device sequence pins p0 = 1 (the final FMA adds the constant 1.0)")
    x = _f32(x)
    # max.f32 returns the non-NaN operand, so NaN takes the -inf path.
    xc = np.fmax(x, CLAMP_LO).astype(np.float32)
    r = add_rm_ftz_f32(xc, ROUND_MAGIC)
    rb = add_f32(r, -ROUND_MAGIC)
    f = add_f32(xc, -rb)
    p = np.full_like(f, cs[-1])
    for c in reversed(cs[:-1]):
        p = fma_f32(p, f, c)
    r_bits = r.view(np.uint32).astype(np.uint64)
    p_bits = p.view(np.uint32).astype(np.uint64)
    out_bits = (((r_bits << np.uint64(23)) & np.uint64(0xFFFFFFFF)) + p_bits) & np.uint64(0xFFFFFFFF)
    return out_bits.astype(np.uint32).view(np.float32).reshape(np.shape(x))


def exp2_mufu_model(x) -> np.ndarray:
    """Reference for ex2.approx.ftz.f32: exact 2^x rounded to fp32, denormal results flushed.

    The hardware is an approximation (max 2 ulp relative error per the PTX ISA), so this is a
    reference for tolerance checks, not a bit-exact model.
    """
    x = _f32(x)
    with np.errstate(over="ignore"):
        y = np.exp2(_ftz(x).astype(np.float64)).astype(np.float32)
    return _ftz(y)


def exp2_fragment_model(values, emu_fraction: float, pattern: str = "block", group: int = 8,
                        coeffs: Sequence[float] | None = None) -> np.ndarray:
    """`exp2_fragment` on a flat fragment: polynomial on `emulated_indices`, MUFU reference elsewhere."""
    from fa4.common.exp2 import emulated_indices

    v = _f32(values).reshape(-1)
    out = exp2_mufu_model(v)
    idx = list(emulated_indices(v.size, emu_fraction, pattern=pattern, group=group))
    if idx:
        out[idx] = exp2_poly_model(v[idx], coeffs)
    return out.reshape(np.shape(values))
