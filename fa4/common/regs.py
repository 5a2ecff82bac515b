"""Register-file rules: the setmaxnreg split a CTA can be granted, and keeping loop-invariant
address arithmetic out of the register file.

A thread's stores into a swizzled shared-memory tile go to addresses that are a function of
the thread index, with no common base + immediate form (the swizzle XORs thread bits into
them). ptxas hoists that arithmetic out of the mainloop and then keeps one register per
address for the whole loop (16 for a 64 x 64 dS^T tile), which the register-bound backward
consumers cannot afford. Passing the thread index through an opaque move inside the loop
makes the addresses loop-variant: they are recomputed (a few integer ops) and die after use.
"""

from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

REGISTER_FILE = 65536  # 32-bit registers per SM on sm_90 (and what one CTA may own)


def launch_registers(threads: int, ctas_per_sm: int = 1) -> int:
    """Registers per thread a kernel of `threads` threads gets at launch with `ctas_per_sm` CTAs
    resident on an SM.

    ptxas allocates in units of 8 per thread; with __launch_bounds__(threads, ctas_per_sm) it may
    use at most the register file divided by all the resident threads.
    """
    return REGISTER_FILE // (threads * ctas_per_sm) // 8 * 8


def reg_split_violation(consumer_wgs: int, consumer: int, producer: int, ctas_per_sm: int = 1) -> str | None:
    """Why a setmaxnreg split (registers per consumer / producer thread) cannot be granted.

    The registers released by setmaxnreg.dec go into a pool owned by the CTA, which holds what
    the CTA got at launch (launch_registers x threads). setmaxnreg.inc blocks until the pool can
    pay for the request, so a split whose total exceeds the launch allocation never completes:
    the consumer warpgroups hang at their first instruction. (240, 32) at 3 warpgroups is such
    a split: 65,536 > 64,512.
    """
    threads = 128 * (consumer_wgs + 1)
    pool = launch_registers(threads, ctas_per_sm) * threads
    need = 128 * (consumer_wgs * consumer + producer)
    for r in (consumer, producer):
        if r % 8 or not 24 <= r <= 256:
            return f"setmaxnreg count {r} must be a multiple of 8 in [24, 256]"
    if need > pool:
        return (
            f"register split {consumer}/{producer} over {consumer_wgs}+1 warpgroups needs {need} registers, "
            f"the CTA owns {pool} ({launch_registers(threads, ctas_per_sm)} x {threads} threads at launch): setmaxnreg.inc "
            "would wait forever"
        )
    return None



@dsl_user_op
def opaque(x: Int32, *, loc=None, ip=None) -> Int32:
    """x, through a volatile mov the compiler may neither hoist nor see through."""
    return Int32(
        llvm.inline_asm(
            T.i32(), [Int32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,r",
            has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@dsl_user_op
def pin_before(guard: Int32, values, *, loc=None, ip=None) -> None:
    """A scheduling fence for ``values`` (fp32 registers): ptxas must compute all of them before
    this point, for the price of one compare and one never-taken branch.

    ptxas schedules across basic blocks and sinks a computation below a branch when only the
    fall-through path uses it. Here the branch (taken when ``guard`` < 0: pass a length, a kernel
    argument no compiler can know is never negative) leads to a block that stores every value
    (to shared memory: no global store for the kernels' codegen checks to count) and traps, so all
    of them must exist before the branch."""
    vals = [Float32(v).ir_value(loc=loc, ip=ip) for v in values]
    body = ["{", ".reg .pred p;", ".reg .u32 a;", "setp.lt.s32 p, $0, 0;", "@!p bra PIN_DONE;", "mov.u32 a, 0;"]
    i = 0
    while i < len(vals):
        width = next(w for w in (4, 2, 1) if i + w <= len(vals))  # PTX vectors: v4, v2
        regs = ", ".join(f"${1 + j}" for j in range(i, i + width))
        vec = f"v{width}." if width > 1 else ""
        body.append(f"st.volatile.shared.{vec}f32 [a+{4 * i}], {'{' + regs + '}' if width > 1 else regs};")
        i += width
    body += ["trap;", "PIN_DONE:", "}"]
    llvm.inline_asm(
        None, [Int32(guard).ir_value(loc=loc, ip=ip), *vals], "\n".join(body),
        ",".join(["r"] + ["f"] * len(vals)), has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
