"""fp32 register fragments to packed 16-bit fragments, two elements per instruction.

Converting element by element (``tensor.store(acc.load().to(bf16))``) gives 16-bit values
that the DSL packs into the 32-bit A-operand registers of a WGMMA (``mov.b32 {lo, hi}``)
right before each wgmma, after the ``wgmma.fence``. An A register written behind the fence
makes ptxas fence every WGMMA of the chain again (one WARPGROUP.ARRIVE per HGMMA), and for
most tile widths the packing costs registers at the mainloop's peak: the forward's hd64
192x128 tile serialized its WGMMAs (C7512) and spilled with it, and fits without.
``cvt.rn.{bf16x2,f16x2}.f32`` writes the packed register directly (F2FP.PACK_AB in SASS),
so the A fragment is complete before the fence. Same rounding (RN) as the element-wise path.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


@dsl_user_op
def pack2(lo: Float32, hi: Float32, dtype: cutlass.Constexpr, *, loc=None, ip=None) -> Int32:
    """Round lo and hi to ``dtype`` (RN) and pack them: lo in bits 0-15, hi in bits 16-31."""
    kind = "bf16x2" if dtype is cutlass.BFloat16 else "f16x2"
    # cvt.rn.<x2>.f32 d, a, b puts a in the upper half and b in the lower one.
    return Int32(
        llvm.inline_asm(
            T.i32(),
            [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
            f"cvt.rn.{kind}.f32 $0, $1, $2;",
            "=r,f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@cute.jit
def to_packed16(src: cute.Tensor, dst: cute.Tensor):
    """dst[i] = dtype(src[i]) for an fp32 fragment and a 16-bit fragment of the same layout.

    Elements 2k and 2k+1 of the flat order must be the two halves of one 32-bit register of
    dst, which holds for WGMMA accumulator and A-operand fragments (pairs of adjacent columns).
    """
    assert dst.element_type in (cutlass.BFloat16, cutlass.Float16)
    n = cute.size(dst)
    # Word i of the recast holds offsets 2i and 2i+1, so the flat order must be the offset order.
    assert all(cute.crd2idx(i, dst.layout) == i for i in range(n)), dst.layout
    words = cute.recast_tensor(dst, Int32)
    for i in cutlass.range_constexpr(cute.size(words)):
        words[i] = pack2(src[2 * i], src[2 * i + 1], dst.element_type)
