"""Our Hopper kernels next to the reference FA4's, instruction by instruction, without a GPU.

Compiles both main kernels (backward, or with --pass fwd the forward) for sm_90a on the CPU (CuTe
DSL, fake tensors with dynamic shapes), disassembles them and prints per-opcode-family counts: where
our kernel issues more instructions than the reference for the same work (stores of dS, barriers,
address arithmetic). Counts are whole kernels: our backward has two copies of the step (masked and
unmasked loops).

    python3 bench/sass_compare.py --hdim 128 --causal
    python3 bench/sass_compare.py --hdim 64 --ours '{"ds_store": "sts"}'
    python3 bench/sass_compare.py --pass fwd --hdim 64

Needs the reference importable (flash-attn-4 with its imports, triton and einops included); the
reference's tiles are its own Hopper defaults (flash_attn.cute.interface._tile_size_*_sm90).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

FAMILIES = ["HGMMA", "MUFU", "BAR", "SYNCS", "LDS", "STS", "STSM", "FFMA", "FMUL", "FADD", "F2FP", "IMAD",
            "ISETP", "LOP3", "SHF", "IADD3", "R2UR", "BRA", "UTMALDG", "UBLKRED", "STG", "RED"]


def histogram(cubin: bytes) -> tuple[int, dict[str, int], int]:
    from fa4.common import codegen_check as cc

    ops = cc.sass_opcodes(cc.disassemble(cubin))
    fam = collections.Counter(o.split(".")[0] for o in ops)
    regs = max(k.registers for k in cc.cubin_resources(cubin).values())
    return len(ops), {f: fam.get(f, 0) for f in FAMILIES}, regs


def cubin_of(compile_with) -> bytes:
    """The cubin of ``compile_with(options)`` (a CuTe DSL compile keeping its cubin)."""
    with tempfile.TemporaryDirectory() as d:
        cub = compile_with(f"--enable-tvm-ffi --keep-cubin --dump-dir={d}").__cubin__
    return cub.encode("latin-1") if isinstance(cub, str) else cub


def ours(hd: int, causal: bool, change: dict) -> bytes:
    from fa4.problem import Problem
    from fa4.sm90.bwd_compile import compile_bwd_main, compile_key
    from fa4.sm90.bwd_defaults import default_config

    cfg = dataclasses.replace(default_config(Problem.standard(8192, hd, causal=causal, pass_="bwd")), **change)
    key = compile_key("bf16", hd, causal, False, False, cfg)
    return cubin_of(lambda options: compile_bwd_main(key, options=options))


def ours_fwd(hd: int, causal: bool, change: dict) -> bytes:
    from fa4.problem import Problem
    from fa4.sm90.compile import compile_fwd, compile_key
    from fa4.sm90.fwd_config import default_config

    cfg = dataclasses.replace(default_config(Problem.standard(8192, hd, causal=causal)), **change)
    key = compile_key("bf16", hd, causal, False, cfg)
    return cubin_of(lambda options: compile_fwd(key, options=options))


def reference_fwd(hd: int, causal: bool) -> bytes:
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32
    from flash_attn.cute.flash_fwd_sm90 import FlashAttentionForwardSm90
    from flash_attn.cute.interface import _tile_size_fwd_sm90
    from quack.compile_utils import make_fake_tensor

    t = _tile_size_fwd_sm90(hd, hd, causal, False)
    b, s_q, s_k, h = (cute.sym_int() for _ in range(4))
    q, o = (make_fake_tensor(cutlass.BFloat16, (b, s_q, h, hd), divisibility=8) for _ in range(2))
    k, v = (make_fake_tensor(cutlass.BFloat16, (b, s_k, h, hd), divisibility=8) for _ in range(2))
    obj = FlashAttentionForwardSm90(
        cutlass.BFloat16, hd, hd, 1, is_causal=causal, is_local=False, pack_gqa=False, tile_m=t.m_block_size,
        tile_n=t.n_block_size, num_stages=2, num_threads=128 * (t.m_block_size // 64 + 1), Q_in_regs=False,
        intra_wg_overlap=t.intra_wg_overlap, mma_pv_is_rs=t.mma_pv_is_rs,
    )
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cubin_of(lambda options: cute.compile(obj, q, k, v, o, None, Float32(1.0), stream=stream, options=options))


def reference(hd: int, causal: bool) -> bytes:
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32
    from flash_attn.cute.flash_bwd_sm90 import FlashAttentionBackwardSm90
    from flash_attn.cute.interface import _tile_size_bwd_sm90, make_fake_bwd_tensors
    from flash_attn.cute.utils import AuxData

    t = _tile_size_bwd_sm90(hd, hd, causal, False)
    mQ, mK, mV, _, mdO, _, mdK, mdV, _, mLSElog2, mPdPsum, dQaccum, _, _, _ = make_fake_bwd_tensors(
        cutlass.BFloat16, False, False, False)
    kw = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)}
    obj = FlashAttentionBackwardSm90(
        cutlass.BFloat16, hd, hd, 1, causal, tile_m=kw["m_block_size"], tile_n=kw["n_block_size"],
        Q_stage=kw["num_stages_Q"], dO_stage=kw["num_stages_dO"], PdS_stage=kw["num_stages_PdS"],
        SdP_swapAB=kw["SdP_swapAB"], dKV_swapAB=kw["dKV_swapAB"], dQ_swapAB=kw["dQ_swapAB"],
        AtomLayoutMSdP=kw["AtomLayoutMSdP"], AtomLayoutNdKV=kw["AtomLayoutNdKV"], AtomLayoutMdQ=kw["AtomLayoutMdQ"],
        num_threads=(kw.get("num_wg", 2) + 1) * 128, dQ_single_wg=kw.get("dQ_single_wg", False),
    )
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cubin_of(lambda options: cute.compile(
        obj, mQ, mK, mV, mdO, mLSElog2, mPdPsum, dQaccum, mdK, mdV, Float32(1.0),
        None, None, None, None, None, None, None, None, None, AuxData(), None, None, stream, options=options))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hdim", type=int, default=128, choices=(64, 128))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), default="bwd")
    ap.add_argument("--ours", default="{}", help="knob changes to our default config (JSON)")
    a = ap.parse_args(argv)
    ours_fn, ref_fn = (ours_fwd, reference_fwd) if a.pass_ == "fwd" else (ours, reference)
    rows = [("ours " + a.ours if a.ours != "{}" else "ours", histogram(ours_fn(a.hdim, a.causal, json.loads(a.ours))))]
    try:
        rows.append(("reference FA4", histogram(ref_fn(a.hdim, a.causal))))
    except ImportError as e:
        print(f"sass_compare: the reference is not importable here ({e}); ours only", file=sys.stderr)
    what = "forward" if a.pass_ == "fwd" else "backward main"
    print(f"{what} kernel, hd{a.hdim}{' causal' if a.causal else ''}, bf16, sm_90a")
    print("| kernel | SASS | regs | " + " | ".join(FAMILIES) + " |")
    print("|---|---:|---:|" + "---:|" * len(FAMILIES))
    for name, (n, fam, regs) in rows:
        print(f"| {name} | {n} | {regs} | " + " | ".join(str(fam[f]) for f in FAMILIES) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
