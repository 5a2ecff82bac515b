"""Keeping loop-invariant address arithmetic out of the register file.

A thread's stores into a swizzled shared-memory tile go to addresses that are a function of
the thread index, with no common base + immediate form (the swizzle XORs thread bits into
them). ptxas hoists that arithmetic out of the mainloop and then keeps one register per
address for the whole loop (16 for a 64 x 64 dS^T tile), which the register-bound backward
consumers cannot afford. Passing the thread index through an opaque move inside the loop
makes the addresses loop-variant: they are recomputed (a few integer ops) and die after use.
"""

from cutlass import Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


@dsl_user_op
def opaque(x: Int32, *, loc=None, ip=None) -> Int32:
    """x, through a volatile mov the compiler may neither hoist nor see through."""
    return Int32(
        llvm.inline_asm(
            T.i32(), [Int32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,r",
            has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )
