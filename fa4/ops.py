"""``fa4::fwd`` and ``fa4::bwd``: fa4.flash_attn_func as torch.library custom ops for torch.compile
(and ``fa4::varlen_fwd`` / ``fa4::varlen_bwd``, the same for flash_attn_varlen_func's packed path).

Dynamo cannot trace a CuTe DSL launch, so under ``torch.compile`` flash_attn_func calls
:func:`traced_flash_attn`, which the compiled graph keeps as these two opaque ops: fake
implementations give the output metadata while tracing, ``register_autograd`` connects
fa4::fwd's backward to fa4::bwd. Eager calls do not go through them: dispatching a Python
custom op added ~17 us per call on this project's CPU machine (~40 us with autograd), several
times the launch path's own host cost, so eager flash_attn_func keeps its fast path and a plain
autograd.Function. Both run the same host code (fa4.launch._forward, _backward,
bwd_config_for); the one difference is when the backward config is resolved: at the forward
call in eager mode (an infeasible bwd_config fails there), at the first backward here (the
fake forward runs on symbolic shapes, before there is a problem to look up).

Op schemas take no dataclasses: a knob config crosses the boundary as canonical JSON (or
None: the lookup chain chooses at run time, as in eager). The forward op always writes LSE
(the backward needs it; ~1.5% more bytes written than the output at head_dim 128), and
``out=`` becomes a copy into the caller's tensor.
"""

import functools
import json
import math
from typing import Optional

import torch

from fa4.knobs import config_to_dict

@torch.compiler.assume_constant_result
def encode_config(config) -> Optional[str]:
    """A knob config (dataclass or dict) as the canonical JSON an op argument carries.

    Dynamo runs this at trace time and keeps the string as a constant of the graph.
    """
    if config is None:
        return None
    if isinstance(config, dict):
        return json.dumps(config, sort_keys=True)
    return json.dumps(config_to_dict(config), sort_keys=True)


@functools.lru_cache(maxsize=256)
def _decoded(text: str) -> tuple:
    return tuple(sorted(json.loads(text).items()))


def decode_config(text: Optional[str]) -> Optional[dict]:
    return None if text is None else dict(_decoded(text))


@torch.library.custom_op("fa4::fwd", mutates_args=())
def fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: Optional[float],
    causal: bool,
    config: Optional[str],
    deterministic: bool,
    bwd_config: Optional[str],
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sink: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    from fa4 import launch

    # deterministic / bwd_config are here for fa4::fwd's backward (register_autograd hands
    # the backward only the forward op's inputs); the forward kernel ignores them. The features
    # come canonical (fa4.features.normalize): -1 for an unbounded side, 0 for no softcap, the
    # sink (heads_q,) fp32.
    return launch._forward(q, k, v, softmax_scale, causal, True, decode_config(config), None, window_left,
                           window_right, softcap, sink)


@fwd.register_fake
def _fwd_fake(q, k, v, softmax_scale, causal, config, deterministic, bwd_config, window_left=-1, window_right=-1,
              softcap=0.0, sink=None):
    from fa4.tensors import empty_out, validate

    validate(q, k, v, layout=False)
    # The real launch allocates exactly these (empty_like keeps q's strides when q is dense).
    return empty_out(q, v), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


@torch.library.custom_op("fa4::bwd", mutates_args=())
def bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: Optional[float],
    causal: bool,
    deterministic: bool,
    bwd_config: Optional[str],
    dlse: Optional[torch.Tensor] = None,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sink: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsink); an op's outputs are fixed, so without a sink dsink is an empty tensor."""
    from fa4 import launch

    config = launch.bwd_config_for(q, k, v, causal, deterministic, decode_config(bwd_config),
                                   window_left=window_left, window_right=window_right, softcap=softcap,
                                   sink=sink is not None)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[3])
    grads = launch._backward(dout, q, k, v, out, lse, scale, causal, deterministic, config, dlse=dlse,
                             window_left=window_left, window_right=window_right, softcap=softcap, sink=sink)
    return (*grads[:3], grads[3] if sink is not None else _no_dsink(q))


def _no_dsink(q: torch.Tensor) -> torch.Tensor:
    return q.new_empty((0,), dtype=torch.float32)


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, bwd_config, dlse=None,
              window_left=-1, window_right=-1, softcap=0.0, sink=None):
    from fa4.tensors import validate

    validate(q, k, v, layout=False)
    o_shape = (*q.shape[:3], v.shape[3])  # head_dim_v wide
    for name, t in (("dout", dout), ("out", out)):
        if tuple(t.shape) != o_shape or t.dtype != q.dtype:
            raise ValueError(f"{name} must be {o_shape} with q's dtype: {tuple(t.shape)} {t.dtype}")
    if lse.shape != (q.shape[0], q.shape[2], q.shape[1]) or lse.dtype != torch.float32:
        raise ValueError(f"lse must be fp32 of shape {(q.shape[0], q.shape[2], q.shape[1])}")
    dsink = torch.empty_like(sink) if sink is not None else _no_dsink(q)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsink


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, _config, deterministic, bwd_config, wl, wr, softcap, sink = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sink)
    ctx.bwd_args = (softmax_scale, causal, deterministic, bwd_config)
    ctx.features = dict(window_left=wl, window_right=wr, softcap=softcap)


def _fwd_backward(ctx, dout, dlse):
    # The LSE's gradient (zeros where the loss does not use it) enters D in the preprocess.
    q, k, v, out, lse, sink = ctx.saved_tensors
    dq, dk, dv, dsink = torch.ops.fa4.bwd(dout, q, k, v, out, lse, *ctx.bwd_args, dlse, sink=sink, **ctx.features)
    return dq, dk, dv, None, None, None, None, None, None, None, None, (dsink if sink is not None else None)


fwd.register_autograd(_fwd_backward, setup_context=_setup_context)


def traced_flash_attn(q, k, v, softmax_scale, causal, return_lse, config, out, deterministic, bwd_config,
                      window_left=-1, window_right=-1, softcap=0.0, sink=None):
    """flash_attn_func while torch.compile traces (same arguments, same results; the features
    canonical as fa4.features.normalize leaves them)."""
    from fa4.launch import check_bwd_args

    check_bwd_args(deterministic, bwd_config)
    scale = None if softmax_scale is None else float(softmax_scale)
    o, lse = torch.ops.fa4.fwd(q, k, v, scale, bool(causal), encode_config(config), deterministic,
                               encode_config(bwd_config), int(window_left), int(window_right), float(softcap), sink)
    if out is not None:
        out.copy_(o)
        o = out
    return (o, lse) if return_lse else o


# -- packed variable-length sequences (fa4.varlen) ------------------------------------------------
# The same pattern for flash_attn_varlen_func: fa4::varlen_fwd / fa4::varlen_bwd, opaque to the
# compiled graph. cu_seqlens and seqused are tensor inputs (never read on the host, as in eager);
# max_seqlen_q/k are SymInts, concrete by the time the op runs.


@torch.library.custom_op("fa4::varlen_fwd", mutates_args=())
def varlen_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: Optional[torch.Tensor],
    seqused_k: Optional[torch.Tensor],
    softmax_scale: Optional[float],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    sink: Optional[torch.Tensor],
    config: Optional[str],
    deterministic: bool,
    bwd_config: Optional[str],
) -> tuple[torch.Tensor, torch.Tensor]:
    from fa4 import features, varlen

    # The features come canonical (fa4.features.normalize); deterministic / bwd_config are for the
    # backward (register_autograd hands it only the forward op's inputs).
    window = features.window_size(window_left, window_right)
    return varlen._forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                           softmax_scale, causal, window, softcap, sink, True, decode_config(config), None)


@varlen_fwd.register_fake
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                     softmax_scale, causal, window_left, window_right, softcap, sink, config, deterministic,
                     bwd_config):
    return (q.new_empty((q.shape[0], q.shape[1], v.shape[2])),
            q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


@torch.library.custom_op("fa4::varlen_bwd", mutates_args=())
def varlen_bwd(
    dout: Optional[torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: Optional[torch.Tensor],
    seqused_k: Optional[torch.Tensor],
    softmax_scale: Optional[float],
    causal: bool,
    deterministic: bool,
    bwd_config: Optional[str],
    dlse: Optional[torch.Tensor],
    window_left: int,
    window_right: int,
    softcap: float,
    sink: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsink); without a sink dsink is an empty tensor (an op's outputs are fixed)."""
    from fa4 import features, varlen

    # The features come canonical from fa4::varlen_fwd's call (fa4.features.normalize).
    feat = features.Features(causal, window_left, window_right, softcap, sink)
    b = cu_seqlens_q.shape[0] - 1
    # Resolved at the first backward of a key (fa4.lookup caches it), as the dense op does.
    config = varlen.resolve_bwd(q, k, v, b, max_seqlen_q, max_seqlen_k, feat, deterministic,
                                decode_config(bwd_config))
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[2])
    grads = varlen.backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            seqused_q, seqused_k, scale, causal, deterministic, config, dlse, window_left,
                            window_right, softcap, sink)
    return (*grads[:3], grads[3] if sink is not None else _no_dsink(q))


@varlen_bwd.register_fake
def _varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q,
                     seqused_k, softmax_scale, causal, deterministic, bwd_config, dlse, window_left, window_right,
                     softcap, sink):
    dsink = torch.empty_like(sink) if sink is not None else _no_dsink(q)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsink


def _varlen_setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_q, max_k, used_q, used_k, scale, causal, wl, wr, softcap, sink, _config,
     deterministic, bwd_config) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sink, cu_q, cu_k, used_q, used_k)
    ctx.args = (max_q, max_k, scale, causal, deterministic, bwd_config)
    ctx.features = dict(window_left=wl, window_right=wr, softcap=softcap)


def _varlen_backward(ctx, dout, dlse):
    q, k, v, out, lse, sink, cu_q, cu_k, used_q, used_k = ctx.saved_tensors
    max_q, max_k, scale, causal, deterministic, bwd_config = ctx.args
    dq, dk, dv, dsink = torch.ops.fa4.varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, used_q, used_k,
                                                 scale, causal, deterministic, bwd_config, dlse, sink=sink,
                                                 **ctx.features)
    return (dq, dk, dv) + (None,) * 11 + ((dsink if sink is not None else None),) + (None,) * 3


varlen_fwd.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)


def traced_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                  softmax_scale, causal, window_size, softcap, learnable_sink, return_lse, config, deterministic,
                  bwd_config):
    """flash_attn_varlen_func's packed path while torch.compile traces (same arguments, same
    results: fa4.varlen.varlen_forward's, which takes no out= there)."""
    from fa4 import features, varlen
    from fa4.launch import check_bwd_args
    from fa4.tensors import check_bwd_head_dims

    check_bwd_args(deterministic, bwd_config)
    varlen.validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                    require_cuda=False)
    feat = features.normalize(q.unsqueeze(0), causal, window_size, learnable_sink, softcap)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, learnable_sink)):
        check_bwd_head_dims(q.unsqueeze(0), v.unsqueeze(0))
    scale = None if softmax_scale is None else float(softmax_scale)
    o, lse = torch.ops.fa4.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q,
                                      seqused_k, scale, feat.causal, feat.window_left, feat.window_right,
                                      feat.softcap, feat.sink, encode_config(config), bool(deterministic),
                                      encode_config(bwd_config))
    return (o, lse) if return_lse else o
