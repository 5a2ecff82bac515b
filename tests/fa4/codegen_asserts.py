"""Checks every compile-only kernel test makes of the code ptxas produced (shared by the
forward and backward compile tests)."""

from __future__ import annotations

import tempfile


def compile_and_read(build, key, sass_ops):
    """Compile with the PTX and cubin kept; (ptx, cubin bytes, counts of the SASS opcodes asked)."""
    from fa4.common import codegen_check as cc

    with tempfile.TemporaryDirectory() as d:
        compiled = build(key, options=f"--enable-tvm-ffi --keep-ptx --keep-cubin --dump-dir={d}")
        ptx, cubin = compiled.__ptx__, compiled.__cubin__
    if isinstance(cubin, str):
        cubin = cubin.encode("latin-1")
    ops = cc.count_ops(cc.sass_opcodes(cc.disassemble(cubin)), ["HGMMA", "LDL", "STL", *sass_ops])
    return ptx, cubin, ops


def assert_clean(ptx: str, cubin: bytes, ops: dict, consumer_wgs: int, reg_split: tuple[int, int],
                 ctas_per_sm: int = 1) -> None:
    """WGMMA present; no local memory (spills, stack); no WGMMA serialized by ptxas (C7512); the
    registers of the launch bound (``ctas_per_sm`` CTAs an SM); and a setmaxnreg split the CTA can
    be granted from what it got at launch (a split over it hangs)."""
    from fa4.common.regs import launch_registers, reg_split_violation

    res = assert_no_spills(ptx, cubin, ops)
    assert max(k.registers for k in res.values() if k.registers) == launch_registers(128 * (consumer_wgs + 1), ctas_per_sm)
    assert reg_split_violation(consumer_wgs, *reg_split, ctas_per_sm) is None


def assert_clean_fwd(ptx: str, cubin: bytes, ops: dict, config) -> None:
    """assert_clean for a forward kernel: its warpgroups, setmaxnreg split and CTAs an SM are all
    the config's, so a test cannot pair a config with a split it does not compile to."""
    from fa4.sm90.fwd_config import ROWS_PER_WG, reg_split

    assert_clean(ptx, cubin, ops, config.tile_m // ROWS_PER_WG, reg_split(config), config.ctas_per_sm)


def assert_no_spills(ptx: str, cubin: bytes, ops: dict) -> dict:
    """WGMMA present; no local memory (spills, stack); no WGMMA serialized by ptxas (C7512).
    Returns the cubin's per-kernel resources."""
    from fa4.common import codegen_check as cc

    assert ops["HGMMA"] > 0, "no WGMMA in the kernel"
    assert ops["LDL"] == 0 and ops["STL"] == 0, f"local memory traffic (spills): {ops}"
    res = cc.cubin_resources(cubin)
    assert all(not k.frame_bytes for k in res.values())
    per, log = cc.ptxas_verbose(ptx)
    assert "C7512" not in log and "serialized" not in log, log[-800:]
    for name, kr in per.items():
        assert not kr.spill_store_bytes and not kr.spill_load_bytes, (name, kr)
    return res
