"""Compiling the decode and combine kernels: one compiled object per (problem class, config).

The class is what the generated code depends on: dtype, head_dim, causal, paged or contiguous,
whether cache_seqlens is given, split (partials + combine) or not, whether the LSE is written,
and the compile-time knobs (combine only when split) (num_splits and pack_gqa are kernel arguments). Batch, lengths, head
counts, page counts and the split count stay dynamic. Compilation needs no GPU (fake tensors).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fa4.knobs import compile_time_config
from fa4.sm90.compile import DTYPES, _fake_tensor, ensure_target
from fa4.sm90.decode_config import DecodeConfigSm90


@dataclass(frozen=True)
class DecodeKernelKey:
    dtype: str
    head_dim: int
    causal: bool
    paged: bool
    has_seqlens: bool
    split: bool
    has_lse: bool
    config: DecodeConfigSm90  # runtime knobs normalised away


@dataclass(frozen=True)
class CombineKernelKey:
    dtype: str
    head_dim: int
    has_lse: bool
    pdl: bool = False  # launched as a programmatic dependent of the decode kernel (combine="pdl")


def compile_key(dtype: str, head_dim: int, causal: bool, paged: bool, has_seqlens: bool, split: bool,
                has_lse: bool, config: DecodeConfigSm90) -> DecodeKernelKey:
    """Configs that differ only in runtime knobs share one compiled kernel; split, the final LSE is the
    combine kernel's (the decode kernel writes partial LSEs either way), so has_lse does not shape it
    unless the combine is fused; unsplit, the combine knob shapes nothing."""
    cfg = compile_time_config(config)
    if not split:
        cfg = dataclasses.replace(cfg, combine=type(cfg)().combine)
    fused = split and cfg.combine == "fused"
    return DecodeKernelKey(dtype, head_dim, causal, paged, has_seqlens, split, has_lse and (not split or fused), cfg)


def _with_arch(options: str) -> str:
    # sm_90a code whatever the DSL picked as its default (without a GPU it takes the newest arch).
    return options if "--gpu-arch" in options else f"--gpu-arch=sm_90a {options}"


def compile_decode(key: DecodeKernelKey, options: str = "--enable-tvm-ffi"):
    ensure_target()
    import cutlass
    import cutlass.cute as cute

    from fa4.sm90.decode import FlashDecodeSm90

    dt = getattr(cutlass, DTYPES[key.dtype])
    f32, i32 = cutlass.Float32, cutlass.Int32
    q = _fake_tensor(dt, 4, key.head_dim)
    k = _fake_tensor(dt, 4, key.head_dim)
    v = _fake_tensor(dt, 4, key.head_dim)
    fused = key.split and key.config.combine == "fused"
    o = _fake_tensor(dt, 4, key.head_dim) if fused or not key.split else None
    lse = _fake_tensor(f32, 3, tma=False) if key.has_lse else None
    page_table = _fake_tensor(i32, 2, tma=False) if key.paged else None
    seqlens = _fake_tensor(i32, 1, tma=False) if key.has_seqlens else None
    o_part = _fake_tensor(f32, 5, key.head_dim) if key.split else None
    lse_part = _fake_tensor(f32, 4, tma=False) if key.split else None
    ticket = _fake_tensor(i32, 2, tma=False) if fused else None
    kernel = FlashDecodeSm90(dt, key.head_dim, key.causal, key.paged, key.has_seqlens, key.split, key.has_lse,
                             key.config)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(
        kernel, q, k, v, o, lse, page_table, seqlens, o_part, lse_part, ticket,
        f32(1.0), i32(1), i32(1), stream, options=_with_arch(options),
    )


def compile_combine(key: CombineKernelKey, options: str = "--enable-tvm-ffi"):
    ensure_target()
    import cutlass
    import cutlass.cute as cute

    from fa4.sm90.decode_combine import DecodeCombineSm90

    dt = getattr(cutlass, DTYPES[key.dtype])
    f32 = cutlass.Float32
    o_part = _fake_tensor(f32, 5, key.head_dim)
    lse_part = _fake_tensor(f32, 4, tma=False)
    o = _fake_tensor(dt, 4, key.head_dim)
    lse = _fake_tensor(f32, 3, tma=False) if key.has_lse else None
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(DecodeCombineSm90(dt, key.head_dim, key.has_lse, key.pdl), o_part, lse_part, o, lse,
                        stream, options=_with_arch(options))
