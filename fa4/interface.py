"""The user-facing API: ``fa4.flash_attn_func`` with the reference FA4's argument names."""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import is_dataclass

import torch

from fa4.arch import Arch, arch_from_capability
from fa4.dispatch import bwd_entry
from fa4.problem import Problem
from fa4.sm90.fwd_config import HEAD_DIMS, head_dims_v

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_LOG2E = 1.4426950408889634

# Bound once: the two checks flash_attn_func makes on every call (~0.2 us together).
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled

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


def validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, supported_head_dims=HEAD_DIMS,
             require_cuda: bool = True, layout: bool = True) -> None:
    """Reject inputs the kernel cannot take, with a message naming the problem (never a launch).

    ``layout=False`` checks shapes and dtypes only (no device, strides or addresses): what
    the custom ops' fake implementations can know while torch.compile traces.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, head_dim), got shape {tuple(t.shape)}")
        if layout and require_cuda and t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}; fa4 kernels run on CUDA devices only")
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; supported: torch.bfloat16, torch.float16")
        if not layout:
            continue
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
    if layout and not (q.device == k.device == v.device):
        raise ValueError(f"device mismatch: q {q.device}, k {k.device}, v {v.device}")
    if q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0]:
        raise ValueError(f"batch mismatch: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v seqlen differ: {k.shape[1]} vs {v.shape[1]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v head counts differ: {k.shape[2]} vs {v.shape[2]}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"heads_q ({q.shape[2]}) must be a multiple of heads_kv ({k.shape[2]})")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"head_dim mismatch: q {q.shape[3]}, k {k.shape[3]}, v {v.shape[3]}")
    if q.shape[3] not in supported_head_dims:
        raise ValueError(f"head_dim {q.shape[3]} is not supported (supported: {supported_head_dims})")
    if v.shape[3] not in head_dims_v(q.shape[3]):
        raise ValueError(f"head_dim_v {v.shape[3]} is not supported with head_dim {q.shape[3]} (supported: "
                         f"{head_dims_v(q.shape[3])}; head_dim_v != head_dim only as 192/128)")
    if min(q.shape[1], k.shape[1]) < 1:
        raise ValueError("sequence lengths must be >= 1")


def bwd_head_dim_error(q, v) -> str | None:
    """Why the backward kernel cannot take these head dims (it covers fewer than the forward)."""
    from fa4.sm90.bwd_config import HEAD_DIMS as BWD_HEAD_DIMS

    d, dv = q.shape[3], v.shape[3]
    if d in BWD_HEAD_DIMS and dv == d:
        return None
    return (f"fa4's backward supports head_dim {BWD_HEAD_DIMS} with head_dim_v == head_dim, not head_dim {d}, "
            f"head_dim_v {dv} (the forward supports it: run it without gradients, e.g. under torch.no_grad())")


def check_bwd_head_dims(q, v) -> None:
    err = bwd_head_dim_error(q, v)
    if err:
        raise NotImplementedError(err)


def empty_out(q, v) -> torch.Tensor:
    """The output buffer the forward launch allocates: q's layout, head_dim_v wide."""
    if v.shape[3] == q.shape[3]:
        return torch.empty_like(q)
    return q.new_empty((*q.shape[:3], v.shape[3]))


def problem_of(q, k, v, causal: bool, pass_: str = "fwd", deterministic: bool = False) -> Problem:
    return Problem(
        batch=q.shape[0], seqlen_q=q.shape[1], seqlen_k=k.shape[1], heads_q=q.shape[2], heads_kv=k.shape[2],
        head_dim=q.shape[3], head_dim_v=v.shape[3], dtype=_DTYPES[q.dtype], causal=bool(causal),
        deterministic=bool(deterministic), pass_=pass_,
    )


def _resolve_config(problem: Problem, arch: Arch, config):
    """(dispatch entry, config) for ``problem``'s pass: the explicit one (object or dict of its
    knobs) or the lookup chain's, checked for feasibility."""
    from fa4 import lookup

    entry = lookup.entry_for(problem, arch)
    name = "config" if problem.pass_ == "fwd" else "bwd_config"
    if config is None:
        resolve = lookup.resolve_fwd_config if problem.pass_ == "fwd" else lookup.resolve_bwd_config
        config = resolve(problem, arch)
    elif isinstance(config, dict):
        from fa4.knobs import config_from_dict

        config = config_from_dict(entry.config_cls, config)
    if not isinstance(config, entry.config_cls):
        raise ValueError(f"{name} must be a {entry.config_cls.__name__} or a dict of its knobs")
    bad = entry.violations(config, problem, arch)
    if bad:
        raise ValueError(f"infeasible {name}: " + "; ".join(bad))
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
    deterministic: bool = False,
    bwd_config=None,
):
    """Exact attention softmax(q k^T * scale) v; q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D).

    Causal masking is aligned bottom-right when Sq != Sk. Returns ``out`` or
    ``(out, lse)`` with ``lse`` of shape (B, Hq, Sq) in fp32 (natural log; it gets no
    gradient). ``config`` (a FwdConfigSm90 or a dict of its knobs) overrides the tuned
    choice; ``out`` is an optional preallocated output shaped like ``q``.

    When q, k or v requires grad, the output's backward runs our backward kernel:
    ``deterministic=True`` makes dq/dk/dv bitwise reproducible; ``bwd_config`` (a
    BwdConfigSm90 or a dict of its knobs) overrides the tuned backward config, which
    otherwise comes from the same lookup chain as the forward's (``fa4.explain(...,
    pass_="bwd")``). Both are checked at the forward call and unused without grad.
    Under ``torch.compile`` the call goes through the custom ops ``fa4::fwd``/``fa4::bwd``.
    """
    if _is_compiling():
        # Imported here, not at module load: fa4.ops pulls in torch._dynamo (~1 s), which
        # only a torch.compile run needs, and by then it is loaded anyway.
        from fa4.ops import traced_flash_attn

        return traced_flash_attn(q, k, v, softmax_scale, causal, return_lse, config, out, deterministic, bwd_config)
    if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _with_grad(q, k, v, softmax_scale, causal, return_lse, config, out, deterministic, bwd_config)
    return _forward(q, k, v, softmax_scale, causal, return_lse, config, out)


@functools.lru_cache(maxsize=None)
def _sm_count(device) -> int:
    """Streaming multiprocessors of ``device``: the grid of a persistent kernel."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def _forward(q, k, v, softmax_scale, causal, return_lse, config, out):
    """The forward launch; returns ``out`` or ``(out, lse)``. No autograd."""
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
        key = entry.compile_key(problem.dtype, problem.head_dim, problem.causal, return_lse, resolved,
                                problem.head_dim_v)
        # The config's runtime arguments of the kernel, derived once per key, not per launch.
        runtime = (resolved.tau, resolved.head_swizzle, 1 if resolved.sched_order == "lpt" else 0,
                   _sm_count(q.device) if resolved.persistent else 0)
        hit = (get_compiled(entry, key), runtime)
        if len(_launch_cache) > 4096:
            _launch_cache.clear()
        _launch_cache[fast_key] = hit
    elif q.data_ptr() % 16 or k.data_ptr() % 16 or v.data_ptr() % 16:
        raise ValueError("q, k and v must be 16-byte aligned")
    fn, runtime = hit
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[3])
    if out is None:
        out = empty_out(q, v)
    elif (out.shape != (*q.shape[:3], v.shape[3]) or out.dtype != q.dtype or out.device != q.device
          or (out.stride() != q.stride() if v.shape[3] == q.shape[3] else not _tma_ready(out))):
        # head_dim_v != head_dim: q's strides cannot fit; any layout the TMA store takes does.
        raise ValueError("out must match q in shape (head_dim_v wide), dtype, device and strides")
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device, dtype=torch.float32) if return_lse else None
    with torch.cuda.device(q.device):
        fn(q, k, v, out, lse, softmax_scale * _LOG2E, *runtime)
    return (out, lse) if return_lse else out


# -- backward ---------------------------------------------------------------------------------

_bwd_configs: dict = {}


def check_bwd_args(deterministic, bwd_config) -> None:
    """Type checks of the backward's arguments that need no tensors (feasibility comes later)."""
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    if bwd_config is not None and not isinstance(bwd_config, dict) and not is_dataclass(bwd_config):
        raise ValueError(f"bwd_config must be a BwdConfigSm90, a dict of its knobs or None, "
                         f"got {type(bwd_config).__name__}")


def bwd_config_for(q, k, v, causal: bool, deterministic: bool, bwd_config):
    """Resolved backward config of a launch, cached like the forward's fast path."""
    check_bwd_args(deterministic, bwd_config)
    check_bwd_head_dims(q, v)
    key = (q.shape, k.shape, q.dtype, q.device, bool(causal), deterministic,
           bwd_config if not isinstance(bwd_config, dict) else tuple(sorted(bwd_config.items())))
    hit = _bwd_configs.get(key)
    if hit is None:
        validate(q, k, v)
        problem = problem_of(q, k, v, causal, pass_="bwd", deterministic=deterministic)
        hit = _resolve_config(problem, _arch_of(q.device), bwd_config)[1]
        if len(_bwd_configs) > 4096:
            _bwd_configs.clear()
        _bwd_configs[key] = hit
    return hit


def _tma_ready(t: torch.Tensor) -> bool:
    # What the backward's TMA loads need of dO: unit inner stride, other strides non-zero
    # multiples of 16 bytes (a broadcast gradient, e.g. of out.sum(), has stride 0), aligned base.
    if t.stride(-1) != 1 or t.data_ptr() % 16:
        return False
    return all(s > 0 and (s * t.element_size()) % 16 == 0 for s in t.stride()[:-1])


def _backward(dout, q, k, v, out, lse, softmax_scale, causal, config):
    """(dq, dk, dv) by our backward kernel with an already resolved config."""
    if not _tma_ready(dout):
        dout = dout.contiguous()
    run = bwd_entry(_arch_of(q.device)).run
    return run(dout, q, k, v, out, lse, softmax_scale, causal, config.deterministic, config)


class _FlashAttnFunc(torch.autograd.Function):
    """Eager autograd: the kernels called directly (cheaper per call than the custom ops)."""

    @staticmethod
    def forward(ctx, q, k, v, out, softmax_scale, causal, config, bwd_config):
        o, lse = _forward(q, k, v, softmax_scale, causal, True, config, out)
        if out is not None:
            ctx.mark_dirty(out)
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.softmax_scale, ctx.causal, ctx.bwd_config = softmax_scale, causal, bwd_config
        return o, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        if ctx.bwd_config is None:
            check_bwd_head_dims(q, v)  # raises: the forward ran at a head dim the backward lacks
        dq, dk, dv = _backward(dout, q, k, v, o, lse, ctx.softmax_scale, ctx.causal, ctx.bwd_config)
        return dq, dk, dv, None, None, None, None, None


def _with_grad(q, k, v, softmax_scale, causal, return_lse, config, out, deterministic, bwd_config):
    # Resolved now, so an infeasible bwd_config fails at this call rather than in backward(); at
    # head dims the backward lacks the forward still runs, and backward() raises.
    if bwd_head_dim_error(q, v) is None:
        resolved = bwd_config_for(q, k, v, causal, deterministic, bwd_config)
    else:
        check_bwd_args(deterministic, bwd_config)
        resolved = None
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[3])
    o, lse = _FlashAttnFunc.apply(q, k, v, out, float(softmax_scale), bool(causal), config, resolved)
    return (o, lse) if return_lse else o
