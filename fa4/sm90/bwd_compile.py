"""Compiling the Hopper backward kernels: one compiled object per (problem class, config).

Three kernels: preprocess and postprocess depend only on (dtype, head dims); the main kernel
on dtype, head_dim and head_dim_v, causal, whether K/V heads are shared (GQA: with gqa_reduce
'atomic' dK/dV become fp32 accumulators) and the compile-time knobs. Shapes stay dynamic. Compiles without a GPU
(CUTE_DSL_ARCH=sm_90a, fake tensors), like fa4.sm90.compile.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass

from fa4.knobs import compile_time_config
from fa4.sm90.bwd_config import SEQ_PAD, BwdConfigSm90, dkv_sums
from fa4.sm90.compile import DTYPES, ensure_target



@dataclass(frozen=True)
class BwdKernelKey:
    dtype: str
    head_dim: int
    causal: bool
    gqa: bool
    deterministic: bool  # the problem's: semaphore-ordered dQ (and GQA dK/dV) adds
    config: BwdConfigSm90  # runtime knobs normalised away
    head_dim_v: int = 0  # 0: head_dim (set by compile_key)
    # Issue 18's features (fa4.sm90.bwd): the window's bounds (a right bound only without causal,
    # which is right = 0), softcap, a learnable sink (the main kernel's code is the plain one:
    # the forward's LSE holds the sink; the key keeps the contract's one name set).
    has_window_left: bool = False
    has_window_right: bool = False
    has_softcap: bool = False
    has_sink: bool = False
    # Packed variable-length sequences (cu_seqlens), and whether seqused_q / seqused_k are given.
    varlen: bool = False
    seqused_q: bool = False
    seqused_k: bool = False

    @property
    def dv(self) -> int:
        return self.head_dim_v or self.head_dim


def compile_key(dtype: str, head_dim: int, causal: bool, gqa: bool, deterministic: bool,
                config: BwdConfigSm90, head_dim_v: int | None = None, has_window_left: bool = False,
                has_window_right: bool = False, has_softcap: bool = False, has_sink: bool = False,
                varlen: bool = False, seqused_q: bool = False, seqused_k: bool = False) -> BwdKernelKey:
    base = compile_time_config(config)
    if not (causal or has_window_left or has_window_right):
        base = dataclasses.replace(base, mask_bits=False)  # no bound moves per row: the same kernel
    # One key per kernel: head_dim_v == head_dim is stored as 0 (the keys of before it existed).
    hdv = 0 if head_dim_v in (None, head_dim) else head_dim_v
    if (seqused_q or seqused_k) and not varlen:
        raise ValueError("seqused_q/seqused_k belong to varlen kernels")
    return BwdKernelKey(dtype, head_dim, causal, gqa, deterministic, base, hdv, bool(has_window_left),
                        bool(has_window_right) and not causal, bool(has_softcap), bool(has_sink), bool(varlen),
                        bool(seqused_q), bool(seqused_k))


def padded(seqlen: int) -> int:
    return (seqlen + SEQ_PAD - 1) // SEQ_PAD * SEQ_PAD


def _fake(cutlass_dtype, shape_static: tuple, row_major_static: bool = False, tma: bool = True):
    """Fake tensor with dynamic shape/strides except the static entries given (None = dynamic).

    ``row_major_static``: the tensor is compact with static inner extents, so its strides
    below the batch/head modes are compile-time constants (the fp32 side buffers).
    """
    import cutlass.cute as cute

    rank = len(shape_static)
    shape = tuple(cute.sym_int() if s is None else s for s in shape_static)
    if row_major_static:
        # (batch, heads, seq_pad, d): strides (dyn, dyn, d, 1) or (batch, heads, n): (dyn, dyn, 1).
        # The host allocates them 16-byte aligned with padded extents (see padded()).
        div = 128 // cutlass_dtype.width
        if rank == 4:
            stride = (cute.sym_int64(divisibility=div), cute.sym_int64(divisibility=div), shape_static[3], 1)
        else:
            stride = (cute.sym_int64(divisibility=div), cute.sym_int64(divisibility=div), 1)
    else:
        div = 128 // cutlass_dtype.width if tma else 1
        stride = tuple(cute.sym_int64(divisibility=div) for _ in range(rank - 1)) + (1,)
    return cute.runtime.make_fake_tensor(cutlass_dtype, shape, stride=stride, assumed_align=16)


def _opts(options: str) -> str:
    return options if "--gpu-arch" in options else f"--gpu-arch=sm_90a {options}"


def compile_bwd_main(key: BwdKernelKey, options: str = "--enable-tvm-ffi"):
    ensure_target()
    import cutlass
    import cutlass.cute as cute

    from fa4.sm90.bwd import FlashBwdSm90

    dt = getattr(cutlass, DTYPES[key.dtype])
    d, dv = key.head_dim, key.dv
    f32 = cutlass.Float32
    q = _fake(dt, (None, None, None, d))
    k = _fake(dt, (None, None, None, d))
    v = _fake(dt, (None, None, None, dv))
    do = _fake(dt, (None, None, None, dv))
    lse2 = _fake(f32, (None, None, None), row_major_static=True)
    dsum = _fake(f32, (None, None, None), row_major_static=True)
    dqacc = _fake(f32, (None, None, None, d), row_major_static=True)
    sums = dkv_sums(key.config, key.gqa)  # as the kernel and the launch decide it
    atomic = sums != "store"  # dK/dV summed in fp32 accumulators
    if atomic:
        dk = _fake(f32, (None, None, None, d), row_major_static=True)
        dv_ = _fake(f32, (None, None, None, dv), row_major_static=True)
    else:
        dk = _fake(dt, (None, None, None, d))
        dv_ = _fake(dt, (None, None, None, dv))
    det = key.deterministic
    sem_q = _fake(cutlass.Int32, (None, None, None), row_major_static=True) if det else None
    # gqa_finish 'last_cta': the tiles' ticket counters (turns when deterministic), and the outputs.
    last = sums == "last_cta"
    sem_kv = _fake(cutlass.Int32, (None, None, None), row_major_static=True) if (det or last) and atomic else None
    dk_out = _fake(dt, (None, None, None, d)) if last else None
    dv_out = _fake(dt, (None, None, None, dv)) if last else None
    kernel = FlashBwdSm90(dt, d, key.causal, key.gqa, key.deterministic, key.config, head_dim_v=dv,
                          has_window_left=key.has_window_left, has_window_right=key.has_window_right,
                          has_softcap=key.has_softcap, has_sink=key.has_sink, varlen=key.varlen)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    i32 = cutlass.Int32
    cu_q, cu_k, used_q, used_k = _varlen_fakes(key.varlen, key.seqused_q, key.seqused_k)
    return cute.compile(
        kernel, q, k, v, do, lse2, dsum, dqacc, dk, dv_, sem_q, sem_kv, dk_out, dv_out, cu_q, cu_k, used_q, used_k,
        # scale_log2, scale, window_left, window_right, softcap_inv, softcap_log2, max_seqlen_k, the
        # runtime knobs.
        f32(1.0), f32(1.0), i32(0), i32(0), f32(0.0), f32(0.0), i32(0), i32(1), i32(1), stream,
        options=_opts(options),
    )


def _varlen_fakes(varlen: bool, seqused_q: bool = False, seqused_k: bool = False):
    """(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k) fakes: (B+1,) / (B,) int32 on the device,
    16-byte aligned bases (the host clones a misaligned one), None where not given."""
    import cutlass

    def vec(on):
        return _fake(cutlass.Int32, (None,), tma=False) if on else None

    return vec(varlen), vec(varlen), vec(seqused_q), vec(seqused_k)


def compile_bwd_pre(dtype: str, head_dim: int, options: str = "--enable-tvm-ffi", head_dim_v: int | None = None,
                    has_dlse: bool = False, varlen: bool = False, seqused: bool = False, has_sink: bool = False,
                    det_tile_m: int = 0, seqused_k: bool = False):
    """D from O and dO (head_dim_v wide; minus the LSE's gradient with has_dlse), the zeroed dQ
    accumulator (head_dim wide); with has_sink each row's term of the sink's gradient too. Varlen with
    det_tile_m (the deterministic main kernel's tile_m): each sequence's rows to zero from its own key
    count (cu_seqlens_k, and seqused_k with ``seqused_k``)."""
    ensure_target()
    import cutlass
    import cutlass.cute as cute

    from fa4.sm90.bwd_prepost import BwdPreprocess

    dt = getattr(cutlass, DTYPES[dtype])
    f32 = cutlass.Float32
    dv = head_dim_v or head_dim
    o = _fake(dt, (None, None, None, dv))
    do = _fake(dt, (None, None, None, dv))
    lse = _fake(f32, (None, None, None), tma=False)
    lse2 = _fake(f32, (None, None, None), row_major_static=True)
    dsum = _fake(f32, (None, None, None), row_major_static=True)
    dqacc = _fake(f32, (None, None, None, head_dim), row_major_static=True)
    dlse = _fake(f32, (None, None, None), tma=False) if has_dlse else None
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    cu, cu_k, used, used_k = _varlen_fakes(varlen, seqused, seqused_k)
    if not (varlen and det_tile_m):
        # Only the deterministic varlen variant reads each sequence's key count.
        cu_k = used_k = None
    sink = _fake(f32, (None,), tma=False) if has_sink else None
    sink_term = _fake(f32, (None, None, None), row_major_static=True) if has_sink else None
    return cute.compile(BwdPreprocess(dt, head_dim, dv, has_dlse, varlen, has_sink, det_tile_m if varlen else 0), o,
                        do, lse, lse2, dsum, dqacc, dlse, cu, used, sink, sink_term, cutlass.Int32(0), cutlass.Int32(0),
                        cu_k, used_k, cutlass.Int32(0), stream, options=_opts(options))


def compile_bwd_post(dtype: str, head_dim: int, options: str = "--enable-tvm-ffi", varlen: bool = False,
                     seqused: bool = False):
    ensure_target()
    import cutlass
    import cutlass.cute as cute

    from fa4.sm90.bwd_prepost import BwdPostprocess

    dt = getattr(cutlass, DTYPES[dtype])
    f32 = cutlass.Float32
    acc = _fake(f32, (None, None, None, head_dim), row_major_static=True)
    out = _fake(dt, (None, None, None, head_dim))
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    cu, _, used, _ = _varlen_fakes(varlen, seqused)
    return cute.compile(BwdPostprocess(dt, head_dim, varlen), acc, out, f32(1.0), cu, used, cutlass.Int32(0), stream,
                        options=_opts(options))


def compile_bwd_post_dq(
    dtype: str, head_dim: int, tile_m: int, dq_split: str = "head_dim", options: str = "--enable-tvm-ffi",
    varlen: bool = False, seqused: bool = False, pair: bool = False,
):
    """dQ postprocess: reads the fragment-ordered accumulator of a main kernel with this tile_m and
    dq_split (``pair``: with cluster_exchange, the tile in two column halves)."""
    ensure_target()
    import cutlass
    import cutlass.cute as cute

    from fa4.sm90.bwd_prepost import BwdPostprocessDq

    dt = getattr(cutlass, DTYPES[dtype])
    f32 = cutlass.Float32
    acc = _fake(f32, (None, None, None, head_dim), row_major_static=True)
    # dQ is allocated like Q, whose strides the main kernel's TMA already requires in 16-byte units.
    out = _fake(dt, (None, None, None, head_dim))
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    cu, _, used, _ = _varlen_fakes(varlen, seqused)
    return cute.compile(
        BwdPostprocessDq(dt, head_dim, tile_m, dq_split, varlen, pair), acc, out, f32(1.0), cu, used,
        cutlass.Int32(0), stream, options=_opts(options),
    )
