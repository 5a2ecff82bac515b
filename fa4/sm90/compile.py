"""Compiling the Hopper forward kernel: one compiled object per (problem class, config).

The problem class is what the generated code depends on: dtype, head_dim (and head_dim_v),
causal, whether LSE is written, and the compile-time knobs. Batch, sequence lengths and
head counts stay dynamic, so one compilation serves every shape of the class.
Compilation needs no GPU (CUTE_DSL_ARCH=sm_90a with fake tensors).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from fa4.knobs import compile_time_config
from fa4.sm90.fwd_config import FwdConfigSm90

DTYPES = {"bf16": "BFloat16", "fp16": "Float16"}


@dataclass(frozen=True)
class FwdKernelKey:
    dtype: str
    head_dim: int
    causal: bool
    has_lse: bool
    config: FwdConfigSm90  # runtime knobs normalised away, see compile_key()
    head_dim_v: int = 0  # 0: head_dim (set by compile_key)
    # Issue 18's features, compile-time (the window sizes and the cap are runtime arguments).
    has_window_left: bool = False
    has_window_right: bool = False
    has_softcap: bool = False
    has_sink: bool = False
    # Packed variable-length sequences (cu_seqlens), and whether seqused_q / seqused_k are given.
    varlen: bool = False
    seqused_q: bool = False
    seqused_k: bool = False


def ensure_target() -> None:
    """Without a GPU the DSL cannot detect the arch: compile for sm_90a (read when cutlass loads)."""
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_gpu = False
    if not has_gpu:
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


def compile_key(dtype: str, head_dim: int, causal: bool, has_lse: bool, config: FwdConfigSm90,
                head_dim_v: int | None = None, *, has_window_left: bool = False, has_window_right: bool = False,
                has_softcap: bool = False, has_sink: bool = False, varlen: bool = False,
                seqused_q: bool = False, seqused_k: bool = False) -> FwdKernelKey:
    """Configs that differ only in runtime knobs, or in knobs inert in them (the exp2 pattern at
    fraction 0: fa4.knobs.canonical_config), share one compiled kernel."""
    base = compile_time_config(config)
    if not has_softcap:
        # No tanh to split (violations() rejects the knob there; a key must not tell them apart).
        base = dataclasses.replace(base, tanh_fma_frac=0.0)
    if not (causal or has_window_left or has_window_right):
        base = dataclasses.replace(base, mask_bits=False)  # no bound moves per row: the same kernel
    if (seqused_q or seqused_k) and not varlen:
        raise ValueError("seqused_q/seqused_k belong to varlen kernels")
    return FwdKernelKey(dtype, head_dim, causal, has_lse, base, head_dim_v or head_dim, bool(has_window_left),
                        bool(has_window_right), bool(has_softcap), bool(has_sink), bool(varlen), bool(seqused_q),
                        bool(seqused_k))



def _fake_tensor(cutlass_dtype, rank: int, static_last: int | None = None, tma: bool = True):
    import cutlass.cute as cute

    # 16-byte alignment (8 elements of 16 bits) is what TMA needs of every stride but the last;
    # tensors written with plain stores (LSE) promise nothing.
    div = 128 // cutlass_dtype.width if tma else 1
    shape = tuple(cute.sym_int() for _ in range(rank - 1)) + (
        static_last if static_last is not None else cute.sym_int(),
    )
    stride = tuple(cute.sym_int64(divisibility=div) for _ in range(rank - 1)) + (1,)
    return cute.runtime.make_fake_tensor(cutlass_dtype, shape, stride=stride, assumed_align=16)


def compile_fwd(key: FwdKernelKey, options: str = "--enable-tvm-ffi"):
    """Compile the kernel for ``key``; returns the callable CuTe DSL compiled object."""
    ensure_target()
    import cutlass
    import cutlass.cute as cute

    from fa4.sm90.fwd import FlashFwdSm90

    dt = getattr(cutlass, DTYPES[key.dtype])
    q = _fake_tensor(dt, 4, key.head_dim)
    k = _fake_tensor(dt, 4, key.head_dim)
    head_dim_v = key.head_dim_v or key.head_dim
    v = _fake_tensor(dt, 4, head_dim_v)
    o = _fake_tensor(dt, 4, head_dim_v)
    lse = _fake_tensor(cutlass.Float32, 3, tma=False) if key.has_lse else None
    sink = _fake_tensor(cutlass.Float32, 1, tma=False) if key.has_sink else None
    # Varlen: (B+1,) cumulative offsets and (B,) used lengths, int32 on the device.
    cu_q = _fake_tensor(cutlass.Int32, 1, tma=False) if key.varlen else None
    cu_k = _fake_tensor(cutlass.Int32, 1, tma=False) if key.varlen else None
    used_q = _fake_tensor(cutlass.Int32, 1, tma=False) if key.seqused_q else None
    used_k = _fake_tensor(cutlass.Int32, 1, tma=False) if key.seqused_k else None
    kernel = FlashFwdSm90(dt, key.head_dim, key.causal, key.has_lse, key.config, head_dim_v,
                          has_window_left=key.has_window_left, has_window_right=key.has_window_right,
                          has_softcap=key.has_softcap, has_sink=key.has_sink, varlen=key.varlen)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    if "--gpu-arch" not in options:
        # This kernel is sm_90a code whatever the DSL picked as default (without a GPU it
        # falls back to the newest arch, and an earlier import may have fixed that default).
        options = f"--gpu-arch=sm_90a {options}"
    return cute.compile(
        kernel, q, k, v, o, lse, sink, cu_q, cu_k, used_q, used_k,
        # scale_log2, softcap_scale, window_left, window_right, max_seqlen_q, then the runtime knobs
        # and the grid.
        cutlass.Float32(1.0), cutlass.Float32(1.0), cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(0),
        cutlass.Float32(0.0), cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), stream,
        options=options,
    )
