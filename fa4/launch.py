"""The host side of a launch: the fast path, config resolution, the autograd function.

fa4.interface.flash_attn_func calls into here in eager mode, fa4.ops's custom ops under
torch.compile; both pass through the same _forward, bwd_config_for and _backward.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import is_dataclass

import torch

from fa4.common.constants import LOG2_E
from fa4.compile_cache import compiled
from fa4.dispatch import bwd_entry
from fa4.knobs import runtime_args
from fa4.lookup import resolve_config
from fa4.record import observed
from fa4.tensors import (arch_of, bwd_head_dim_error, check_bwd_head_dims, device_guard, empty_out, problem_of,
                         tma_ready, validate)

_launch_cache: dict = {}


@functools.lru_cache(maxsize=None)
def _sm_count(device) -> int:
    """Streaming multiprocessors of ``device``: the grid of a persistent kernel."""
    return torch.cuda.get_device_properties(device).multi_processor_count


@observed("fwd")
def _forward(q, k, v, softmax_scale, causal, return_lse, config, out, window_left=-1, window_right=-1,
             softcap=0.0, sink=None):
    """The forward launch; returns ``out`` or ``(out, lse)``. No autograd.

    The features come checked and canonical (fa4.features.normalize): window sides -1 when
    unbounded, softcap 0 when off, ``sink`` a (heads_q,) fp32 tensor or None."""
    # Fast path: a launch with the same shapes, strides, dtype and config as an earlier one
    # skips validation, config resolution and the feasibility check (all pure functions of
    # this key), so the host cost is one tuple hash and the kernel call.
    fast_key = (
        q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
        q.device, k.device, v.device, bool(causal), bool(return_lse),
        config if not isinstance(config, dict) else tuple(sorted(config.items())),
        # The sink's presence, never its identity: each launch passes the tensor it was given.
        window_left, window_right, softcap, sink is not None,
    )
    hit = _launch_cache.get(fast_key)
    if hit is None:
        validate(q, k, v)
        problem = problem_of(q, k, v, causal, window_left=window_left, window_right=window_right,
                             softcap=softcap, sink=sink is not None)
        arch = arch_of(q.device)
        entry, resolved = resolve_config(problem, arch, config)
        key = entry.compile_key(problem.dtype, problem.head_dim, problem.causal, return_lse, resolved,
                                problem.head_dim_v, **problem.kernel_flags())
        # The kernel's runtime arguments, derived once per key, not per launch: the runtime
        # knobs, then the grid of a persistent kernel (a property of the GPU, not a knob).
        runtime = (*runtime_args(resolved), _sm_count(q.device) if resolved.persistent else 0)
        hit = (compiled(key, lambda: entry.compile(key)), runtime)
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
          or (out.stride() != q.stride() if v.shape[3] == q.shape[3] else not tma_ready(out))):
        # head_dim_v != head_dim: q's strides cannot fit; any layout the TMA store takes does.
        raise ValueError("out must match q in shape (head_dim_v wide), dtype, device and strides")
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device, dtype=torch.float32) if return_lse else None
    # Softcap: the kernel keeps t = tanh(s * scale / c) and exponentiates c * t (fa4.common.softcap).
    scale_log2, softcap_scale = ((softcap * LOG2_E, softmax_scale / softcap) if softcap
                                 else (softmax_scale * LOG2_E, 1.0))
    with device_guard(q):
        fn(q, k, v, out, lse, sink, None, None, None, None, scale_log2, softcap_scale, window_left, window_right, 0,
           *runtime)
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


def with_features(problem, **features):
    """``problem`` with issue 18's fields (window_left, window_right, softcap, sink) set where the
    Problem has them and they are not the defaults, so the lookup chain and violations() see them."""
    have = {f: x for f, x in features.items() if hasattr(problem, f) and x != _FEATURE_DEFAULTS[f]}
    return dataclasses.replace(problem, **have) if have else problem


_FEATURE_DEFAULTS = dict(window_left=-1, window_right=-1, softcap=0.0, sink=False)


def bwd_config_for(q, k, v, causal: bool, deterministic: bool, bwd_config, window_left=-1, window_right=-1,
                   softcap=0.0, sink=False):
    """Resolved backward config of a launch, cached like the forward's fast path."""
    check_bwd_args(deterministic, bwd_config)
    features = dict(window_left=window_left, window_right=window_right, softcap=float(softcap), sink=bool(sink))
    key = (q.shape, k.shape, v.shape[3], q.dtype, q.device, bool(causal), deterministic,
           bwd_config if not isinstance(bwd_config, dict) else tuple(sorted(bwd_config.items())),
           *features.values())
    hit = _bwd_configs.get(key)
    if hit is None:
        # Head dims are in the key: checked once per key, as the rest of the validation.
        check_bwd_head_dims(q, v)
        validate(q, k, v)
        problem = with_features(problem_of(q, k, v, causal, pass_="bwd", deterministic=deterministic), **features)
        hit = resolve_config(problem, arch_of(q.device), bwd_config)[1]
        if len(_bwd_configs) > 4096:
            _bwd_configs.clear()
        _bwd_configs[key] = hit
    return hit


@observed("bwd")
def _backward(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, config, dlse=None,
              window_left=-1, window_right=-1, softcap=0.0, sink=None):
    """(dq, dk, dv) by our backward kernel with an already resolved config, and dsink fourth
    with a learnable ``sink``; ``dlse`` is the returned LSE's gradient, None where the loss does
    not use it; the window bounds (-1: unbounded) and softcap as the forward's."""
    if dout is None:  # only the LSE is in the loss
        dout = torch.zeros_like(out)
    elif not tma_ready(dout):
        dout = dout.contiguous()
    run = bwd_entry(arch_of(q.device)).run
    # Only what is asked is passed: the plain call is the one of before the features.
    extra = {n: x for n, x in dict(dlse=dlse, sink=sink).items() if x is not None}
    extra.update({n: x for n, x in dict(window_left=window_left, window_right=window_right, softcap=softcap).items()
                  if x != _FEATURE_DEFAULTS[n]})
    return run(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, config, **extra)


class _FlashAttnFunc(torch.autograd.Function):
    """Eager autograd: the kernels called directly (cheaper per call than the custom ops).

    apply() takes the tensors autograd must see (q, k, v, ``out`` for mark_dirty, the learnable
    ``sink`` for its gradient) and one tuple of the rest, and backward() returns six gradients:
    Function.apply walks every argument on each call and the engine every gradient slot."""

    @staticmethod
    def forward(ctx, q, k, v, out, sink, args):
        # The features come canonical from fa4.features.normalize: -1 for an unbounded side.
        softmax_scale, causal, config, deterministic, bwd_config, window_left, window_right, softcap = args
        o, lse = _forward(q, k, v, softmax_scale, causal, True, config, out, window_left, window_right, softcap,
                          sink)
        if out is not None:
            ctx.mark_dirty(out)
        # The LSE is differentiable (its gradient enters D in the preprocess); a gradient the
        # loss does not give arrives as None, not as a tensor of zeros.
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, o, lse, sink)
        ctx.softmax_scale, ctx.causal, ctx.bwd_config = softmax_scale, causal, bwd_config
        ctx.deterministic = deterministic
        ctx.features = dict(window_left=window_left, window_right=window_right, softcap=softcap)
        return o, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, o, lse, sink = ctx.saved_tensors
        if ctx.bwd_config is None:
            check_bwd_head_dims(q, v)  # raises: the forward ran at a head dim the backward lacks
        if dout is None and dlse is None:
            return (None,) * 6
        grads = _backward(dout, q, k, v, o, lse, ctx.softmax_scale, ctx.causal, ctx.deterministic,
                          ctx.bwd_config, dlse=dlse, sink=sink, **ctx.features)
        dsink = grads[3] if sink is not None else None
        return grads[0], grads[1], grads[2], None, dsink, None


def window_bounds(window_size) -> tuple[int, int]:
    """(left, right) with -1 for an unbounded side, from the reference's window_size (None or -1:
    unbounded)."""
    if window_size is None:
        return -1, -1
    left, right = window_size
    return (-1 if left is None or left < 0 else int(left)), (-1 if right is None or right < 0 else int(right))


def _with_grad(q, k, v, softmax_scale, causal, return_lse, config, out, deterministic, bwd_config,
               window_size=(None, None), softcap=0.0, learnable_sink=None):
    # Resolved now, so an infeasible bwd_config fails at this call rather than in backward(); at
    # head dims the backward lacks the forward still runs, and backward() raises.
    left, right = window_bounds(window_size)
    softcap = float(softcap or 0.0)
    if bwd_head_dim_error(q, v) is None:
        resolved = bwd_config_for(q, k, v, causal, deterministic, bwd_config, window_left=left, window_right=right,
                                  softcap=softcap, sink=learnable_sink is not None)
    else:
        check_bwd_args(deterministic, bwd_config)
        resolved = None
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[3])
    o, lse = _FlashAttnFunc.apply(q, k, v, out, learnable_sink, (float(softmax_scale), bool(causal), config,
                                                                 deterministic, resolved, left, right, softcap))
    return (o, lse) if return_lse else o
