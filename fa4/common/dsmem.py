"""Distributed shared memory between the CTAs of a cluster, as inline PTX where the DSL has no op.

The backward's 2-CTA dS exchange (fa4.common.bwd_pair) copies a whole swizzled dS tile into the
peer CTA's identically laid out buffer with one bulk copy (the tile's bytes, not its elements:
both CTAs allocate the same struct), completing on an mbarrier in the peer CTA. The handshake
around it uses the DSL's own mbarrier ops (a remote arrive at cluster scope, plain waits).
"""

import cutlass.cute as cute
from cutlass import Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op


@dsl_user_op
def bulk_copy_to_peer(dst: cute.Pointer, src: cute.Pointer, nbytes, mbar: cute.Pointer, peer, *, loc=None,
                      ip=None) -> None:
    """One thread: the peer CTA's shared [dst, dst + nbytes) = this CTA's [src, ...); ``dst`` and
    ``mbar`` are this CTA's addresses of the peer's buffer and barrier (mapped with mapa), and the
    copy's bytes complete the peer's mbarrier transaction count. 16-byte aligned, nbytes % 16 == 0."""
    llvm.inline_asm(
        None,
        [dst.toint(loc=loc, ip=ip).ir_value(), src.toint(loc=loc, ip=ip).ir_value(),
         Int32(nbytes).ir_value(loc=loc, ip=ip), mbar.toint(loc=loc, ip=ip).ir_value(),
         Int32(peer).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b32 d, b;\n\t"
        "mapa.shared::cluster.u32 d, $0, $4;\n\t"
        "mapa.shared::cluster.u32 b, $3, $4;\n\t"
        "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [d], [$1], $2, [b];\n\t}",
        "r,r,r,r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )
