"""The user-facing API: ``fa4.flash_attn_func`` with the reference FA4's argument names."""

from __future__ import annotations

import math
import threading

import torch

from fa4.arch import Arch, arch_from_capability
from fa4.dispatch import fwd_entry
from fa4.problem import Problem

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_LOG2E = 1.4426950408889634

_compiled: dict = {}
_launch_cache: dict = {}
_compile_lock = threading.Lock()
_arch_by_device: dict[int, Arch] = {}


def _arch_of(device: torch.device) -> Arch:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    arch = _arch_by_device.get(idx)
    if arch is None:
        arch = arch_from_capability(*torch.cuda.get_device_capability(idx))
        _arch_by_device[idx] = arch
    return arch


def validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, supported_head_dims=(64, 128),
             require_cuda: bool = True) -> None:
    """Reject inputs the kernel cannot take, with a message naming the problem (never a launch)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, head_dim), got shape {tuple(t.shape)}")
        if require_cuda and t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}; fa4 kernels run on CUDA devices only")
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; supported: torch.bfloat16, torch.float16")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension (stride {t.stride(-1)})")
        for d in range(3):
            if (t.stride(d) * t.element_size()) % 16:
                raise ValueError(
                    f"{name}.stride({d}) = {t.stride(d)} elements is not a multiple of 16 bytes (TMA needs it)"
                )
        if t.data_ptr() % 16:
            raise ValueError(f"{name} is not 16-byte aligned")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"dtype mismatch: q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"device mismatch: q {q.device}, k {k.device}, v {v.device}")
    if q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0]:
        raise ValueError(f"batch mismatch: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v seqlen differ: {k.shape[1]} vs {v.shape[1]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v head counts differ: {k.shape[2]} vs {v.shape[2]}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"heads_q ({q.shape[2]}) must be a multiple of heads_kv ({k.shape[2]})")
    if not (q.shape[3] == k.shape[3] == v.shape[3]):
        raise ValueError(f"head_dim mismatch: q {q.shape[3]}, k {k.shape[3]}, v {v.shape[3]}")
    if q.shape[3] not in supported_head_dims:
        raise ValueError(f"head_dim {q.shape[3]} is not supported (supported: {supported_head_dims})")
    if min(q.shape[1], k.shape[1]) < 1:
        raise ValueError("sequence lengths must be >= 1")


def problem_of(q, k, v, causal: bool) -> Problem:
    return Problem(
        batch=q.shape[0], seqlen_q=q.shape[1], seqlen_k=k.shape[1], heads_q=q.shape[2], heads_kv=k.shape[2],
        head_dim=q.shape[3], head_dim_v=v.shape[3], dtype=_DTYPES[q.dtype], causal=bool(causal), pass_="fwd",
    )


def _resolve_config(problem: Problem, arch: Arch, config):
    entry = fwd_entry(arch)
    if config is None:
        from fa4 import lookup

        config = lookup.resolve_fwd_config(problem, arch)
    elif isinstance(config, dict):
        from fa4.knobs import config_from_dict

        config = config_from_dict(entry.config_cls, config)
    if not isinstance(config, entry.config_cls):
        raise ValueError(f"config must be a {entry.config_cls.__name__} or a dict of its knobs")
    bad = entry.violations(config, problem, arch)
    if bad:
        raise ValueError("infeasible config: " + "; ".join(bad))
    return entry, config


def get_compiled(entry, key):
    fn = _compiled.get(key)
    if fn is None:
        with _compile_lock:
            fn = _compiled.get(key)
            if fn is None:
                fn = entry.compile(key)
                _compiled[key] = fn
    return fn


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    return_lse: bool = False,
    config=None,
    out: torch.Tensor | None = None,
):
    """Exact attention softmax(q k^T * scale) v; q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D).

    Causal masking is aligned bottom-right when Sq != Sk. Returns ``out`` or
    ``(out, lse)`` with ``lse`` of shape (B, Hq, Sq) in fp32 (natural log).
    ``config`` (a FwdConfigSm90 or a dict of its knobs) overrides the tuned choice;
    ``out`` is an optional preallocated output shaped like ``q``.
    """
    # Fast path: a launch with the same shapes, strides, dtype and config as an earlier one
    # skips validation, config resolution and the feasibility check (all pure functions of
    # this key), so the host cost is one tuple hash and the kernel call.
    fast_key = (
        q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
        q.device, k.device, v.device, bool(causal), bool(return_lse),
        config if not isinstance(config, dict) else tuple(sorted(config.items())),
    )
    hit = _launch_cache.get(fast_key)
    if hit is None:
        validate(q, k, v)
        problem = problem_of(q, k, v, causal)
        arch = _arch_of(q.device)
        entry, resolved = _resolve_config(problem, arch, config)
        key = entry.compile_key(problem.dtype, problem.head_dim, problem.causal, return_lse, resolved)
        hit = (get_compiled(entry, key), resolved)
        if len(_launch_cache) > 4096:
            _launch_cache.clear()
        _launch_cache[fast_key] = hit
    elif q.data_ptr() % 16 or k.data_ptr() % 16 or v.data_ptr() % 16:
        raise ValueError("q, k and v must be 16-byte aligned")
    fn, config = hit
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[3])
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or out.stride() != q.stride():
        raise ValueError("out must match q in shape, dtype, device and strides")
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device, dtype=torch.float32) if return_lse else None
    with torch.cuda.device(q.device):
        fn(q, k, v, out, lse, softmax_scale * _LOG2E, config.tau, config.head_swizzle,
           1 if config.sched_order == "lpt" else 0)
    return (out, lse) if return_lse else out
