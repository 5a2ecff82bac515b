"""Softcap of attention scores for the sm_90a forward: s -> c * tanh(s / c), on MUFU or the FMA pipe.

The reference FA4's convention: the scaled score s = q.k * softmax_scale is capped before the
softmax (and before the mask, which then sets -inf). The kernels keep t = tanh(q.k * scale / c)
in the score registers and run the usual softmax on t with scale_log2 = c * log2(e), so the row
max, the exp2 split and the LSE need nothing new: c * t * log2(e) is the capped score in log2
units. The backward's derivative 1 - t^2 comes from the same t (fa4/common/softcap_bwd.py).

Why two tanh paths: with softcap every score needs a tanh and an exp2, both on MUFU (16 per
clock per SM against 128 FP32 FMAs), so the softmax is MUFU-bound twice over. ``tanh_fma``
evaluates a compile-time subset of a thread's elements on the FMA and integer pipes instead:

    y = min(|x| * 2 log2(e), 64)           FMUL (|x| is an operand modifier), FMNMX
    e = 2^y                                the exp2_poly sequence (fa4/common/exp2.py) without its
                                           low clamp (y >= 0), degree 5: 3 FADD, 5 FFMA, 1 LEA
    d = e + 1,  r0 = bits(0x7EF311C3 - bits(d))   FADD, IADD: a reciprocal seed within 12.5%
    r = r0 (2 - d r0), three times         3 x (FFMA, FFMA): relative error below 6e-8
    t = copysign(1 - 2 r, x)               FFMA, LOP3

tanh(|x|) = 1 - 2 / (1 + e^{2|x|}). Near x = 0 this cancels: t's absolute error is about half
of e's relative error plus r's, and the capped score c * t carries c times that, the same for
every key of a row's small scores (a bias, not noise that the PV sum averages away). The softmax's
degree-3 exp2 (8.6e-5) and two Newton steps gave 4.4e-5 near |x| = 0.03, 1.3e-3 on the score at
c = 30: the H200 found the forward over the error rule with the split. Degree 5 (8.2e-8) and a
third step bring it to 1.5e-7 for every fp32 x (tests/fa4/test_softcap.py, bit-exact model in
fa4/common/softcap_model.py). 21 instructions for one MUFU.TANH: it pays only while the issue
slots have room, hence a fraction knob (FwdConfigSm90.tanh_fma_frac).

Everything below emits device code: call it only while a kernel is traced.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from fa4.common.exp2 import EXP2_POLY_COEFFS, ROUND_MAGIC, _add_rm_ftz, _add_to_exponent, _asm_f32, _sub_rn, fma_rn

TWO_LOG2_E = 2.8853900817779268  # 2 log2(e): e^{2|x|} = 2^(2 log2(e) |x|)
# 2^64 + 1 rounds to 2^64 in fp32 and 1 - 2 / 2^64 to 1.0: tanh is saturated long before (at
# |x| > 9.01 in fp32), and the exp2 sequence stays far from its exponent overflow at 128.
Y_MAX = 64.0
# The reciprocal seed: 0x7EF311C3 - bits(d) is within 12.5% of 1/d for every normal d > 0
# (a linear fit of -log2 over each binade; Newton doubles the correct bits each step).
RCP_MAGIC = 0x7EF311C3
NEWTON_STEPS = 3
# 2^f on [0, 1) for the tanh alone (the softmax's exp2 keeps degree 3): see the module docstring.
TANH_EXP2_DEGREE = 5
TANH_EXP2_POLY = EXP2_POLY_COEFFS[TANH_EXP2_DEGREE]


@dsl_user_op
def tanh_mufu(x: Float32, *, loc=None, ip=None) -> Float32:
    """tanh(x) on MUFU (one MUFU.TANH; max relative error 2^-10.99 per the PTX ISA)."""
    return _asm_f32("tanh.approx.f32 $0, $1;", "=f,f", [x], loc=loc, ip=ip)


@dsl_user_op
def _mul_abs(x: Float32, k: Float32, *, loc=None, ip=None) -> Float32:
    return _asm_f32("{\n\t.reg .f32 a;\n\tabs.f32 a, $1;\n\tmul.rn.f32 $0, a, $2;\n\t}", "=f,f,f", [x, k],
                    loc=loc, ip=ip)


@dsl_user_op
def _min_f32(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    return _asm_f32("min.f32 $0, $1, $2;", "=f,f,f", [a, b], loc=loc, ip=ip)


@dsl_user_op
def _add_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    return _asm_f32("add.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], loc=loc, ip=ip)


def _i32(x: Float32, loc=None, ip=None):
    return llvm.bitcast(T.i32(), Float32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip)


@dsl_user_op
def _rcp_seed(d: Float32, *, loc=None, ip=None) -> Float32:
    out = llvm.inline_asm(
        T.i32(), [_i32(d, loc, ip)], f"sub.s32 $0, {RCP_MAGIC}, $1;", "=r,r",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return Float32(llvm.bitcast(T.f32(), out, loc=loc, ip=ip))


@dsl_user_op
def _copysign(mag: Float32, sign_of: Float32, *, loc=None, ip=None) -> Float32:
    """|mag| with the sign of sign_of (mag >= 0 here): one LOP3."""
    out = llvm.inline_asm(
        T.i32(), [_i32(mag, loc, ip), _i32(sign_of, loc, ip)],
        "{\n\t.reg .b32 s;\n\tand.b32 s, $2, 0x80000000;\n\tor.b32 $0, $1, s;\n\t}", "=r,r,r",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return Float32(llvm.bitcast(T.f32(), out, loc=loc, ip=ip))


def tanh_fma(x: Float32, k: Float32 | float = TWO_LOG2_E) -> Float32:
    """tanh(x * k / (2 log2 e)) on the FMA and integer pipes: the sequence in the module docstring.

    With the default k, tanh(x). The kernels pass the raw score and k = 2 log2(e) * scale / c,
    which folds the score's scaling into the one FMUL. x = +-inf gives +-1."""
    y = _min_f32(_mul_abs(x, Float32(k)), Float32(Y_MAX))
    r = _add_rm_ftz(y, Float32(ROUND_MAGIC))
    f = _sub_rn(y, _sub_rn(r, Float32(ROUND_MAGIC)))
    p = Float32(TANH_EXP2_POLY[-1])
    for c in reversed(TANH_EXP2_POLY[:-1]):
        p = fma_rn(p, f, Float32(c))
    e = _add_to_exponent(r, p)
    d = _add_rn(e, Float32(1.0))
    q = _rcp_seed(d)
    for _ in range(NEWTON_STEPS):
        err = fma_rn(-d, q, Float32(1.0))
        q = fma_rn(q, err, q)
    return _copysign(fma_rn(Float32(-2.0), q, Float32(1.0)), x)


@cute.jit
def softcap_scores(
    s_mn: cute.Tensor,  # ((2, MMA_M), (2, V, MMA_N)) raw q.k, overwritten with t = tanh(q.k * softcap_scale)
    softcap_scale: Float32,  # softmax_scale / softcap
    fma_cols: cutlass.Constexpr,  # frozenset of column indices whose tanh runs on the FMA pipe
):
    """t = tanh(s * softmax_scale / c) in place, before the mask (the reference's order)."""
    k = softcap_scale * Float32(TWO_LOG2_E)
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
            if cutlass.const_expr(c in fma_cols):
                s_mn[r, c] = tanh_fma(s_mn[r, c], k)
            else:
                s_mn[r, c] = tanh_mufu(s_mn[r, c] * softcap_scale)


__all__ = ["NEWTON_STEPS", "RCP_MAGIC", "TANH_EXP2_POLY", "TWO_LOG2_E", "Y_MAX", "softcap_scores", "tanh_fma", "tanh_mufu"]
