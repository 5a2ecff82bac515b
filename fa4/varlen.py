"""The host side of packed variable-length attention (``flash_attn_varlen_func`` with cu_seqlens).

q (total_q, Hq, D), k/v (total_k, Hkv, D/Dv) hold B sequences back to back; cu_seqlens_q/k (B+1,)
int32 on the device give their row offsets, max_seqlen_q/k (host ints) bound their lengths, and
seqused_q/k (B,) optionally the rows used of each. The kernel is the dense forward compiled with
``varlen`` (fa4.sm90.fwd): the packed tensors go in as a batch of one, the grid is
ceil(max_seqlen_q / tile_m) x heads x B. LSE comes back as (Hq, total_q), the reference's varlen
shape. With a gradient required (q, k, v or the sink), the call goes through an autograd
Function whose backward is the varlen backward (fa4.sm90.bwd_launch.launch_bwd_varlen), the
returned LSE's gradient and the sink's included; its config is resolved at the forward call (an
infeasible one fails there), from the backward Problem of the same packed batch.

Nothing here reads cu_seqlens on the host (no sync); the Problem that picks the config is the
varlen one (fa4.problem: B sequences, the longest lengths, the mean lengths total / B), whose
violations() keep persistent off (the varlen kernel runs a CTA per tile).
"""

from __future__ import annotations

import math

import torch

from fa4 import features
from fa4.common.constants import LOG2_E
from fa4.compile_cache import compiled
from fa4.tensors import DTYPES, arch_of, device_guard, tma_ready

_plans: dict = {}
# The launch's device context and device test; names of their own so CPU tests of the host path
# can stand them in (tests/fa4/test_varlen_host.py).
_on_device = device_guard


def cu_seqlens(lengths, device="cuda") -> torch.Tensor:
    """(B + 1,) int32 row offsets of sequences of ``lengths`` packed back to back: the
    cu_seqlens_q / cu_seqlens_k of flash_attn_varlen_func."""
    import itertools

    return torch.tensor([0, *itertools.accumulate(int(n) for n in lengths)], dtype=torch.int32, device=device)


def _on_cuda(t) -> bool:
    return t.device.type == "cuda"


def _check(name, t, rank, dtypes, device):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must be {rank}-D, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {t.dtype}; supported: {', '.join(map(str, dtypes))}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, q on {device}")


def _check_tma(name, t):
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (stride {t.stride(-1)})")
    for d in range(t.dim() - 1):
        if (t.stride(d) * t.element_size()) % 16:
            raise ValueError(f"{name}.stride({d}) = {t.stride(d)} elements is not a multiple of 16 bytes")
    if t.data_ptr() % 16:
        raise ValueError(f"{name} is not 16-byte aligned")


def _max_len(name, v):
    if isinstance(v, torch.SymInt):  # traced by torch.compile: a host int by the time a kernel runs
        return v
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{name} must be a host int >= 0, got {v!r}")
    return v


def validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
             require_cuda=True) -> int:
    """Check a packed call's tensors; returns the number of sequences B."""
    from fa4.sm90.fwd_config import HEAD_DIMS, head_dims_v

    _check("q", q, 3, tuple(DTYPES), None)
    if require_cuda and q.device.type != "cuda":
        raise ValueError(f"q is on {q.device}; fa4 kernels run on CUDA devices only")
    _check("k", k, 3, (q.dtype,), q.device)
    _check("v", v, 3, (q.dtype,), q.device)
    if k.shape[0] != v.shape[0] or k.shape[1] != v.shape[1]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree in total_k and heads_kv")
    hq, d, hkv = q.shape[1], q.shape[2], k.shape[1]
    if k.shape[2] != d:
        raise ValueError(f"head_dim mismatch: q {d}, k {k.shape[2]}")
    if d not in HEAD_DIMS or v.shape[2] not in head_dims_v(d):
        raise ValueError(f"head_dim {d} / head_dim_v {v.shape[2]} not supported (head dims {HEAD_DIMS})")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"heads_q ({hq}) must be a multiple of heads_kv ({hkv})")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu is None:
            raise ValueError(f"{name} is required for packed sequences (both cu_seqlens_q and cu_seqlens_k)")
        _check(name, cu, 1, (torch.int32,), q.device)
        if not cu.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0] or cu_seqlens_q.shape[0] < 1:
        raise ValueError(f"cu_seqlens_q {tuple(cu_seqlens_q.shape)} and cu_seqlens_k {tuple(cu_seqlens_k.shape)} "
                         "must both be (batch + 1,)")
    b = cu_seqlens_q.shape[0] - 1
    for name, used in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        if used is not None:
            _check(name, used, 1, (torch.int32,), q.device)
            if used.shape[0] != b or not used.is_contiguous():
                raise ValueError(f"{name} must be a contiguous (batch={b},) tensor, got {tuple(used.shape)}")
    _max_len("max_seqlen_q", max_seqlen_q)
    _max_len("max_seqlen_k", max_seqlen_k)
    return b


def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None, seqused_k=None,
                   softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0, learnable_sink=None,
                   return_lse=False, config=None, out=None, deterministic=False, bwd_config=None):
    """Packed-sequence forward; returns ``out`` (total_q, Hq, Dv) or ``(out, lse)``, lse (Hq, total_q)
    fp32 natural log. Rows past a sequence's used length (seqused_q) are zeros (in a given ``out``,
    a contiguous (total_q, Hq, Dv) tensor of q's dtype, they are left as they were). Differentiable
    in q, k, v and learnable_sink (``deterministic``: bitwise-reproducible gradients)."""
    grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, learnable_sink))
    if grad:
        if out is not None:
            raise ValueError("out= is for calls without gradients (autograd needs the output it returns)")
        return _with_grad(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                          softmax_scale, causal, window_size, softcap, learnable_sink, return_lse, config,
                          deterministic, bwd_config)
    return _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                    softmax_scale, causal, window_size, softcap, learnable_sink, return_lse, config, out)


def _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, softmax_scale,
             causal, window_size, softcap, learnable_sink, return_lse, config, out):
    b = validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                 require_cuda=False)
    feat = features.normalize(q.unsqueeze(0), causal, window_size, learnable_sink, softcap)
    total_q, hq = q.shape[0], q.shape[1]
    dv = v.shape[2]
    if b == 0 or total_q == 0 or max_seqlen_q == 0:
        # No query row: nothing to launch (a zero grid is an error).
        out = q.new_zeros((total_q, hq, dv))
        lse = torch.full((hq, total_q), -math.inf, device=q.device, dtype=torch.float32)
        return (out, lse) if return_lse else out
    if not _on_cuda(q):
        raise ValueError(f"q is on {q.device}; fa4 kernels run on CUDA devices only")
    _check_tma("q", q)
    _check_tma("k", k)
    _check_tma("v", v)
    fast_key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, q.device, b,
                max_seqlen_q, max_seqlen_k, seqused_q is not None, seqused_k is not None, feat.causal,
                feat.window_left, feat.window_right, feat.softcap, feat.sink is not None, bool(return_lse),
                config if not isinstance(config, dict) else tuple(sorted(config.items())))
    fn = _plans.get(fast_key)
    if fn is None:
        fn = _plan(q, k, v, b, max_seqlen_q, max_seqlen_k, seqused_q is not None, seqused_k is not None, feat,
                   bool(return_lse), config)
        if len(_plans) > 4096:
            _plans.clear()
        _plans[fast_key] = fn
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[2])
    # Rows no tile writes (past seqused_q) read as zeros, as the reference leaves them.
    if out is None:
        out = q.new_zeros((total_q, hq, dv)) if seqused_q is not None else q.new_empty((total_q, hq, dv))
    elif (out.shape != (total_q, hq, dv) or out.dtype != q.dtype or out.device != q.device
          or not out.is_contiguous() or out.data_ptr() % 16):
        raise ValueError(f"out must be a contiguous, 16-byte aligned ({total_q}, {hq}, {dv}) {q.dtype} tensor")
    lse = None
    if return_lse:
        lse = (torch.full((hq, total_q), -math.inf, device=q.device, dtype=torch.float32) if seqused_q is not None
               else torch.empty(hq, total_q, device=q.device, dtype=torch.float32))
    cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k = (
        _aligned(t) for t in (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k))
    cap = feat.softcap
    scale_log2, softcap_scale = (cap * LOG2_E, softmax_scale / cap) if cap else (softmax_scale * LOG2_E, 1.0)
    fn_, runtime = fn
    with _on_device(q):
        fn_(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), out.unsqueeze(0),
            None if lse is None else lse.unsqueeze(0), feat.sink, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
            scale_log2, softcap_scale, feat.window_left, feat.window_right, max_seqlen_q, *runtime)
    return (out, lse) if return_lse else out


def _aligned(t):
    # The kernels take the int32 vectors from 16-byte aligned bases (a slice like cu[1:] is not).
    return t if t is None or t.data_ptr() % 16 == 0 else t.clone()


def bwd_problem(q, k, v, b, max_seqlen_q, max_seqlen_k, feat, deterministic):
    """The backward Problem of a packed call (problem_of's, pass_ 'bwd')."""
    import dataclasses

    return dataclasses.replace(problem_of(q, k, v, b, max_seqlen_q, max_seqlen_k, feat), pass_="bwd",
                               deterministic=bool(deterministic))


def _with_grad(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, softmax_scale,
               causal, window_size, softcap, learnable_sink, return_lse, config, deterministic, bwd_config):
    from fa4.launch import check_bwd_args
    from fa4.tensors import check_bwd_head_dims

    check_bwd_args(deterministic, bwd_config)
    b = validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                 require_cuda=False)
    feat = features.normalize(q.unsqueeze(0), causal, window_size, learnable_sink, softcap)
    check_bwd_head_dims(q.unsqueeze(0), v.unsqueeze(0))
    resolved = resolve_bwd(q, k, v, b, max_seqlen_q, max_seqlen_k, feat, deterministic, bwd_config)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[2])
    o, lse = _VarlenFunc.apply(q, k, v, learnable_sink, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               seqused_q, seqused_k, float(softmax_scale), feat, config, bool(deterministic),
                               resolved)
    return (o, lse) if return_lse else o


def resolve_bwd(q, k, v, b, max_seqlen_q, max_seqlen_k, feat, deterministic, bwd_config):
    """The backward config of a packed call (the lookup chain's answer for its backward Problem,
    or ``bwd_config`` checked against it); None where there is no work to launch (an empty batch
    answers zeros without a kernel, on any device)."""
    from fa4.lookup import resolve_config

    if b == 0 or q.shape[0] == 0 or max_seqlen_q == 0:
        return None
    if not _on_cuda(q):
        raise ValueError(f"q is on {q.device}; fa4 kernels run on CUDA devices only")
    problem = bwd_problem(q, k, v, b, max_seqlen_q, max_seqlen_k, feat, deterministic)
    return resolve_config(problem, arch_of(q.device), bwd_config)[1]


class _VarlenFunc(torch.autograd.Function):
    """Packed forward with the varlen backward (fa4.sm90.bwd_launch.launch_bwd_varlen)."""

    @staticmethod
    def forward(ctx, q, k, v, sink, cu_q, cu_k, max_q, max_k, used_q, used_k, scale, feat, config, deterministic,
                bwd_config):
        window = features.window_size(feat.window_left, feat.window_right)
        o, lse = _forward(q, k, v, cu_q, cu_k, max_q, max_k, used_q, used_k, scale, feat.causal, window,
                          feat.softcap, sink, True, config, None)
        # The LSE is differentiable (its gradient enters D in the preprocess); a gradient the loss
        # does not give arrives as None.
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, o, lse, sink, cu_q, cu_k, used_q, used_k)
        ctx.args = (max_q, max_k, scale, feat.causal, deterministic, bwd_config, feat.window_left, feat.window_right,
                    feat.softcap)
        return o, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, o, lse, sink, cu_q, cu_k, used_q, used_k = ctx.saved_tensors
        none = (None,) * 11
        if dout is None and dlse is None:
            return (None, None, None, None) + none
        max_q, max_k, scale, causal, deterministic, config, wl, wr, cap = ctx.args
        grads = backward(dout, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, used_q, used_k, scale, causal,
                         deterministic, config, dlse, wl, wr, cap, sink)
        dsink = grads[3] if sink is not None else None
        return (grads[0], grads[1], grads[2], dsink) + none


def backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
             softmax_scale, causal, deterministic, config, dlse, window_left, window_right, softcap, sink):
    """The packed backward launch of eager autograd and of the fa4::varlen_bwd op, for a resolved
    ``config`` and canonical features: ``dout`` None (only the LSE in the loss) as zeros, dO in a
    layout its TMA loads take, the int32 vectors 16-byte aligned."""
    from fa4.sm90.bwd_launch import launch_bwd_varlen

    if dout is None:
        dout = torch.zeros_like(out)
    elif not tma_ready(dout):
        dout = dout.contiguous()
    cu_q, cu_k, used_q, used_k = (_aligned(t) for t in (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k))
    return launch_bwd_varlen(dout, q, k, v, out, lse, cu_q, cu_k, max_seqlen_q, max_seqlen_k, used_q, used_k,
                             softmax_scale, causal, deterministic, config, dlse=dlse, window_left=window_left,
                             window_right=window_right, softcap=softcap, sink=sink)


def problem_of(q, k, v, b, max_seqlen_q, max_seqlen_k, feat):
    """The varlen Problem of a call (the config lookup's question): B sequences, the longest
    lengths, and the mean lengths from the packed totals (no read of cu_seqlens)."""
    from fa4.problem import Problem

    sq, sk = max(max_seqlen_q, 1), max(max_seqlen_k, 1)
    mean = lambda total, top: min(max(round(total / b), 1), top)  # noqa: E731
    return Problem(batch=b, seqlen_q=sq, seqlen_k=sk, heads_q=q.shape[1], heads_kv=k.shape[1], head_dim=q.shape[2],
                   head_dim_v=v.shape[2], dtype=DTYPES[q.dtype], causal=feat.causal, **features.problem_fields(feat),
                   varlen=True, varlen_mean_q=mean(q.shape[0], sq), varlen_mean_k=mean(k.shape[0], sk))


def _plan(q, k, v, b, max_seqlen_q, max_seqlen_k, used_q, used_k, feat, return_lse, config):
    from fa4.knobs import runtime_args
    from fa4.lookup import resolve_config

    problem = problem_of(q, k, v, b, max_seqlen_q, max_seqlen_k, feat)
    entry, cfg = resolve_config(problem, arch_of(q.device), config)
    key = entry.compile_key(problem.dtype, problem.head_dim, problem.causal, return_lse, cfg, problem.head_dim_v,
                            **problem.kernel_flags(), varlen=True, seqused_q=used_q, seqused_k=used_k)
    runtime = (*runtime_args(cfg), 0)
    return compiled(key, lambda: entry.compile(key)), runtime


def tile_schedule(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, tile_m, tile_n, causal=False, window_left=-1,
                  window_right=-1, seqused_q=None, seqused_k=None):
    """A host model of the varlen kernel's work, for tests: {(sequence, m_block): KV tiles loaded,
    highest first} for the tiles that run; the grid's other tiles (m_block * tile_m past the
    sequence's rows) exit at once. The same range arithmetic as the kernel (fa4.common.masking)."""
    from fa4.common.masking import kv_mask_split

    out = {}
    num_m = (max_seqlen_q + tile_m - 1) // tile_m
    for b in range(len(cu_seqlens_q) - 1):
        len_q = seqused_q[b] if seqused_q is not None else cu_seqlens_q[b + 1] - cu_seqlens_q[b]
        len_k = seqused_k[b] if seqused_k is not None else cu_seqlens_k[b + 1] - cu_seqlens_k[b]
        for m in range(num_m):
            if m * tile_m >= len_q:
                continue
            n_min, n_max, _, _ = kv_mask_split(m, tile_m, tile_n, len_q, len_k, causal, window_left >= 0,
                                               window_right >= 0, window_left, window_right)
            out[(b, m)] = list(range(n_max - 1, n_min - 1, -1))
    return out
