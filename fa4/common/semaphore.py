"""Global-memory ordering primitives for the deterministic backward, as inline PTX.

A turn semaphore is one int32 in global memory per accumulated tile. The CTA whose turn
is ``t`` spins (one thread) with an acquire load until the counter reads ``t``; the
acquire makes every earlier holder's reductions visible before this CTA adds its own.
After its adds (and a CTA barrier so all threads' adds precede it in program order of the
signalling thread, which the fence makes cumulative), one thread increments the counter
with a release reduction, handing the tile to the next turn.

The fp32 reductions (red.global.add[.v2].f32) are the relaxed adds used for dQ, dK and dV
accumulation; the semaphore is what fixes their order.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def _addr(ptr: cute.Pointer, loc=None, ip=None):
    return ptr.toint(loc=loc, ip=ip).ir_value()


@dsl_user_op
def ld_acquire(ptr: cute.Pointer, *, loc=None, ip=None) -> Int32:
    """ld.acquire.gpu: later reads of this thread see every write released before the value read."""
    return Int32(
        llvm.inline_asm(
            T.i32(), [_addr(ptr, loc, ip)], "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l",
            has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@dsl_user_op
def red_release_add(ptr: cute.Pointer, val: Int32, *, loc=None, ip=None) -> None:
    """red.release.gpu add: publishes this thread's (and, after a fence, the CTA's) earlier writes."""
    llvm.inline_asm(
        None, [_addr(ptr, loc, ip), Int32(val).ir_value(loc=loc, ip=ip)],
        "red.release.gpu.global.add.s32 [$0], $1;", "l,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def fence_acq_rel_gpu(*, loc=None, ip=None) -> None:
    """fence.acq_rel.gpu: makes the CTA's reductions observed through a bar.sync cumulative."""
    llvm.inline_asm(
        None, [], "fence.acq_rel.gpu;", "",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def red_add_f32(ptr: cute.Pointer, a: Float32, *, loc=None, ip=None) -> None:
    llvm.inline_asm(
        None, [_addr(ptr, loc, ip), Float32(a).ir_value(loc=loc, ip=ip)],
        "red.relaxed.gpu.global.add.f32 [$0], $1;", "l,f",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def red_add_f32x2(ptr: cute.Pointer, a: Float32, b: Float32, *, loc=None, ip=None) -> None:
    """Two adjacent fp32 adds in one instruction (sm_90; the address must be 8-byte aligned)."""
    llvm.inline_asm(
        None,
        [_addr(ptr, loc, ip), Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
        "red.relaxed.gpu.global.add.v2.f32 [$0], {$1, $2};", "l,f,f",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def st_f32(ptr: cute.Pointer, a: Float32, *, loc=None, ip=None) -> None:
    """A plain store where a deterministic reduction's first turn writes instead of adding (the
    sums then need no zeros beforehand): the red_add_f32 sibling, the same address operand."""
    llvm.inline_asm(
        None, [_addr(ptr, loc, ip), Float32(a).ir_value(loc=loc, ip=ip)],
        "st.global.f32 [$0], $1;", "l,f",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def st_f32x2(ptr: cute.Pointer, a: Float32, b: Float32, *, loc=None, ip=None) -> None:
    """red_add_f32x2's first-turn sibling: two adjacent fp32 stored (8-byte aligned)."""
    llvm.inline_asm(
        None, [_addr(ptr, loc, ip), Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
        "st.global.v2.f32 [$0], {$1, $2};", "l,f,f",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def bulk_store_f32(gmem: cute.Pointer, smem: cute.Pointer, nbytes, *, loc=None, ip=None) -> None:
    """One thread: global[0:nbytes] = shared[0:nbytes] (async bulk copy, bulk_group): a
    deterministic reduction's first turn, bulk_reduce_add_f32's sibling."""
    llvm.inline_asm(
        None,
        [gmem.llvm_ptr, smem.toint(loc=loc, ip=ip).ir_value(), Int32(nbytes).ir_value(loc=loc, ip=ip)],
        "cp.async.bulk.global.shared::cta.bulk_group [$0], [$1], $2;", "l,r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def bulk_reduce_add_f32(gmem: cute.Pointer, smem: cute.Pointer, nbytes, *, loc=None, ip=None) -> None:
    """One thread: global[0:nbytes] += shared[0:nbytes] (fp32, async bulk reduction, bulk_group)."""
    llvm.inline_asm(
        None,
        [gmem.llvm_ptr, smem.toint(loc=loc, ip=ip).ir_value(), Int32(nbytes).ir_value(loc=loc, ip=ip)],
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;", "l,r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@cute.jit
def wait_turn(ptr: cute.Pointer, turn: Int32, is_leader) -> None:
    """The leader thread spins until the counter equals ``turn``; the caller then barriers."""
    if is_leader:
        seen = ld_acquire(ptr)
        while seen != turn:
            seen = ld_acquire(ptr)


@cute.jit
def pass_turn(ptr: cute.Pointer, is_leader, increment: cutlass.Constexpr = 1) -> None:
    """Called after a barrier that follows every thread's adds: fence, then release the next turn
    (``increment``: DONE where the counter is a ticket counter)."""
    if is_leader:
        fence_acq_rel_gpu()
        red_release_add(ptr, Int32(increment))


# ---------------------------------------------------------------- tickets (gqa_finish 'last_cta')
# One int32 a tile, zeroed: the low 16 bits count the CTAs that arrived (each takes the old
# count as its ticket), the high bits those that are done with the tile.
TICKET_MASK = 0xFFFF
DONE = 1 << 16


@dsl_user_op
def atom_add_acq_rel(ptr: cute.Pointer, val: Int32, *, loc=None, ip=None) -> Int32:
    """atom.acq_rel.gpu add: the old value (this thread's ticket)."""
    return Int32(
        llvm.inline_asm(
            T.i32(), [_addr(ptr, loc, ip), Int32(val).ir_value(loc=loc, ip=ip)],
            "atom.acq_rel.gpu.global.add.s32 $0, [$1], $2;", "=r,l,r",
            has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@dsl_user_op
def barrier_or(barrier_id: int, number_of_threads: int, pred: Int32, *, loc=None, ip=None) -> Int32:
    """bar.red.or on a named barrier: 1 in every participating thread if any thread's ``pred`` is
    non-zero, else 0 (a barrier that also broadcasts one bit, e.g. the leader's verdict)."""
    return Int32(
        llvm.inline_asm(
            T.i32(), [Int32(pred).ir_value(loc=loc, ip=ip)],
            "{\n .reg .pred q, p;\n setp.ne.s32 q, $1, 0;\n"
            f" bar.red.or.pred p, {int(barrier_id)}, {int(number_of_threads)}, q;\n"
            " selp.s32 $0, 1, 0, p;\n}",
            "=r,r",
            has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        )
    )


@cute.jit
def take_ticket(ptr: cute.Pointer, group: Int32, is_leader) -> Int32:
    """The leader takes this CTA's ticket among the ``group`` CTAs of a tile, and waits for what
    its ticket needs: the first (ticket 0) nothing, the last (group - 1) every other CTA done, the
    ones between the first done (its store is what they add to). Every CTA waited for took its
    ticket earlier, so it is running or finished: no wait on a CTA that has not launched. Returns
    the ticket in the leader (-1 elsewhere); the caller broadcasts what it needs with barrier_or."""
    ticket = Int32(-1)
    if is_leader:
        ticket = atom_add_acq_rel(ptr, Int32(1)) & TICKET_MASK
        if ticket > 0:
            need = Int32(1)
            if ticket == group - 1:
                need = group - 1
            seen = ld_acquire(ptr) >> 16
            while seen < need:
                seen = ld_acquire(ptr) >> 16
    return ticket
