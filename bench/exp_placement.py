"""Where ptxas puts the softmax's exponentials, without a GPU: for each head dim's default kernel
(forward and backward) with and without exp_pin, the MUFU.EX2 between a consumer's wait for its
first GEMM group and its wait for the last (WARPGROUP.DEPBAR.LE gsb0, 1 then 0): the forward's
under PV(j-1), the backward's under dP^T. One count per mainloop (masked, unmasked), and whether
the kernel is clean (no spills, no serialized WGMMA).

    CUTE_DSL_ARCH=sm_90a python3 bench/exp_placement.py --pass fwd --hds 64,128
    python3 bench/exp_placement.py --pass bwd --hds 192,192v128,256
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def head_dims(spec: str) -> list[tuple[int, int]]:
    out = []
    for part in spec.split(","):
        d, _, dv = part.partition("v")
        out.append((int(d), int(dv or d)))
    return out


def placement(pass_: str, hd: int, hdv: int, causal: bool, exp_pin: bool) -> dict:
    from fa4.common import codegen_check as cc
    from fa4.problem import Problem
    from tests.fa4.codegen_asserts import assert_clean, compile_and_read

    prob = Problem.standard(8192, hd, head_dim_v=hdv, causal=causal, pass_=pass_)
    if pass_ == "fwd":
        from fa4.sm90.compile import compile_fwd, compile_key
        from fa4.sm90.fwd_config import REG_SPLIT, default_config, violations

        config = dataclasses.replace(default_config(prob), exp_pin=exp_pin)
        build, key = compile_fwd, compile_key("bf16", hd, causal, True, config, hdv)
        wgs, split = config.tile_m // 64, REG_SPLIT[config.tile_m // 64]
    else:
        from fa4.sm90.bwd_compile import compile_bwd_main, compile_key
        from fa4.sm90.bwd_config import REG_SPLIT, violations
        from fa4.sm90.bwd_defaults import default_config

        config = dataclasses.replace(default_config(prob), exp_pin=exp_pin)
        build, key = compile_bwd_main, compile_key("bf16", hd, causal, False, False, config, hdv)
        wgs, split = 2, REG_SPLIT
    if violations(config, prob):
        return {"infeasible": [str(v) for v in violations(config, prob)]}
    ptx, cubin, ops = compile_and_read(build, key, ["MUFU.EX2"])
    try:
        assert_clean(ptx, cubin, ops, wgs, split)
        clean = True
    except AssertionError:
        clean = False
    return {"under_gemm": cc.ops_between_waits(cc.disassemble(cubin), "MUFU.EX2"), "mufu_ex2": ops["MUFU.EX2"],
            "clean": clean}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--hds", default="64,128", help="head dims: d, or dvdv (e.g. 192v128)")
    a = ap.parse_args(argv)
    from fa4.sm90.compile import ensure_target

    ensure_target()
    for hd, hdv in head_dims(a.hds):
        for causal in (False, True):
            row = {"pass": a.pass_, "hd": hd, "hdv": hdv, "causal": causal}
            for pin in (False, True):
                row["exp_pin" if pin else "default"] = placement(a.pass_, hd, hdv, causal, pin)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
