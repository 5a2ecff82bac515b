"""Stand-ins for the two GPU launches so fa4.flash_attn_func's host side runs on CPU tensors.

Only the launches are replaced: ``fa4.launch._forward`` (the forward kernel call) and
``fa4.sm90.bwd_launch.launch_bwd`` (the backward's), both by fp32 math written from the
attention equations (no autograd: under torch.compile the backward op runs below the autograd
dispatch key). Everything between the user's call and those two functions is the real code:
argument checks, the bwd config lookup chain, the autograd.Function, dO layout fixing, the
dispatch entry, the custom ops and their fake implementations. Tests compare the gradients
against bench/check_bwd.py's PyTorch-autograd reference with its error rule, so the stand-ins
are checked too.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location(
    "check_bwd", Path(__file__).resolve().parents[2] / "bench" / "check_bwd.py")


@functools.lru_cache(maxsize=1)
def check_bwd():
    """bench/check_bwd.py as a module: its reference gradients and error rule."""
    mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=1)
def check_bwd_feat():
    """bench/check_bwd_feat.py as a module: the reference with issue 18's features, same error rule."""
    spec = importlib.util.spec_from_file_location(
        "check_bwd_feat", Path(__file__).resolve().parents[2] / "bench" / "check_bwd_feat.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench_module(monkeypatch, name: str):
    """bench/<name>.py as a module on the CPU machine: triton (not installed here) faked, do_bench
    one call of the timed function reported as 1 ms."""
    import sys
    import types

    testing = types.ModuleType("triton.testing")
    testing.do_bench = lambda run, **kw: (run(), 1.0)[1]
    triton = types.ModuleType("triton")
    triton.testing = testing
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setitem(sys.modules, "triton.testing", testing)
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[2] / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _raw_scores(q, k, scale, softcap=0.0):
    """(B, Hq, Sq, Sk) fp32 scores q.k * scale (K expanded to the query heads), softcapped
    c * tanh(s / c) with softcap c > 0; and t = tanh(s / c) (None without softcap)."""
    rep = q.shape[2] // k.shape[2]
    qq = q.float().transpose(1, 2)
    kk = k.float().transpose(1, 2).repeat_interleave(rep, dim=1)
    s = qq @ kk.transpose(-1, -2) * scale
    if softcap > 0:
        t = torch.tanh(s / softcap)
        return softcap * t, t
    return s, None


def _mask(s, sq, sk, causal, window_left=-1, window_right=-1):
    """-inf where query i may not see key j (bottom-right aligned; causal is right = 0)."""
    # On the scores' device: the GPU tests build their reference from CUDA tensors.
    i = torch.arange(sq, device=s.device)[:, None]
    j = torch.arange(sk, device=s.device)[None, :]
    o = sk - sq
    hidden = torch.zeros(sq, sk, dtype=torch.bool, device=s.device)
    if causal or window_right >= 0:
        hidden |= j > i + o + (0 if causal else window_right)
    if window_left >= 0:
        hidden |= j < i + o - window_left
    return s.masked_fill(hidden, float("-inf"))


def _scores(q, k, scale, causal, window_left=-1, window_right=-1, softcap=0.0):
    s, _ = _raw_scores(q, k, scale, softcap)
    return _mask(s, q.shape[1], k.shape[1], causal, window_left, window_right)


def _lse(s, sink=None):
    """Log of each row's softmax denominator, the sink's exp(sink_h) term included."""
    if sink is not None:
        s = torch.cat([s, sink.float().to(s.device)[None, :, None, None].expand(*s.shape[:3], 1)], dim=-1)
    return torch.logsumexp(s, dim=-1)


def _probs(s, lse):
    # Rows that see nothing (no key, no sink) have no softmax: zero output, zero gradient.
    return torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)


def forward_math(q, k, v, scale, causal, window_left=-1, window_right=-1, softcap=0.0, sink=None, out_dtype=None):
    """(out in q's dtype (or out_dtype), lse fp32 (B, Hq, Sq)). ``sink`` (Hq,): one more softmax column
    per head with that logit and no value (in the LSE, not in the output)."""
    rep = q.shape[2] // k.shape[2]
    s = _scores(q, k, scale, causal, window_left, window_right, softcap)
    lse = _lse(s, sink)
    vv = v.float().transpose(1, 2).repeat_interleave(rep, dim=1)
    out = (_probs(s, lse) @ vv).transpose(1, 2)
    return out.to(out_dtype or q.dtype), lse


def backward_math(dout, q, k, v, scale, causal, dlse=None, window_left=-1, window_right=-1, softcap=0.0,
                  sink=None):
    """(dq, dk, dv[, dsink]) from dP = dO V^T, D = rowsum(dP P) - dLSE, dS = P (dP - D) (1 - t^2)
    (softcap t = tanh(s / c)), dK/dV summed over each KV head's group, dsink = -sum exp(sink - LSE) D
    (``dlse``: the returned LSE's gradient, (B, Hq, Sq), or None)."""
    rep = q.shape[2] // k.shape[2]
    raw, t = _raw_scores(q, k, scale, softcap)
    s = _mask(raw, q.shape[1], k.shape[1], causal, window_left, window_right)
    lse = _lse(s, sink)
    p = _probs(s, lse)
    do = dout.float().transpose(1, 2)
    qq = q.float().transpose(1, 2)
    kk = k.float().transpose(1, 2).repeat_interleave(rep, dim=1)
    vv = v.float().transpose(1, 2).repeat_interleave(rep, dim=1)
    dp = do @ vv.transpose(-1, -2)
    dsum = (dp * p).sum(-1, keepdim=True)
    if dlse is not None:
        dsum = dsum - dlse.float()[..., None]
    ds = p * (dp - dsum)
    if t is not None:
        ds = ds * (1 - t * t)
    dq = ds @ kk * scale
    dk = (ds.transpose(-1, -2) @ qq * scale).unflatten(1, (-1, rep)).sum(2)
    dv = (p.transpose(-1, -2) @ do).unflatten(1, (-1, rep)).sum(2)
    grads = tuple(g.transpose(1, 2).to(q.dtype) for g in (dq, dk, dv))
    if sink is None:
        return grads
    share = torch.nan_to_num(torch.exp(sink.float()[None, :, None] - lse), nan=0.0)
    return (*grads, (-(share * dsum[..., 0]).sum(dim=(0, 2))).to(sink.dtype))


@dataclass
class Calls:
    """What the stand-in launches were asked to do."""

    fwd: list = field(default_factory=list)  # (return_lse, config, out is given)
    fwd_features: list = field(default_factory=list)  # dict(window_size=..., softcap=..., learnable_sink=...)
    bwd: list = field(default_factory=list)  # dict(dout=..., deterministic=..., config=..., scale=..., causal=...)
    features: list = field(default_factory=list)  # (causal, window_left, window_right, softcap, sink) per forward


def install(monkeypatch) -> Calls:
    """Replace the two launches, pretend the tensors' device is an sm90 GPU, fresh lookup state."""
    from fa4 import interface, launch, lookup, tensors
    from fa4.arch import SM90
    from fa4.sm90 import bwd_launch
    from fa4.tensors import empty_out

    calls = Calls()

    def fake_forward(q, k, v, softmax_scale, causal, return_lse, config, out, window_left=-1, window_right=-1,
                     softcap=0.0, sink=None):
        scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[3])
        o, lse = forward_math(q, k, v, scale, causal, window_left, window_right, softcap, sink)
        calls.fwd.append((return_lse, config, out is not None))
        calls.features.append((causal, window_left, window_right, softcap, sink))
        calls.fwd_features.append(dict(window_size=(None if window_left < 0 else window_left,
                                                    None if window_right < 0 else window_right),
                                       softcap=softcap, learnable_sink=sink))
        if out is None:
            out = empty_out(q, v)  # what the real launch allocates
        out.copy_(o)
        if not return_lse:
            return out
        lse_buf = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
        lse_buf.copy_(lse)
        return out, lse_buf

    def fake_bwd(dout, q, k, v, out, lse, softmax_scale=None, causal=False, deterministic=False, config=None,
                 dlse=None, window_left=-1, window_right=-1, softcap=0.0, sink=None):
        calls.bwd.append(dict(dout=dout, deterministic=deterministic, config=config, scale=softmax_scale,
                              causal=causal, dlse=dlse, window_left=window_left, window_right=window_right,
                              softcap=softcap, sink=sink))
        # Into buffers shaped as the real launch allocates them (empty_like of q, k, v).
        grads = backward_math(dout, q, k, v, softmax_scale, causal, dlse, window_left, window_right, softcap, sink)
        out = tuple(torch.empty_like(t).copy_(g) for t, g in zip((q, k, v), grads))
        return out if sink is None else (*out, grads[3])

    real_validate = launch.validate
    monkeypatch.setattr(launch, "_forward", fake_forward)
    monkeypatch.setattr(bwd_launch, "launch_bwd", fake_bwd)
    monkeypatch.setattr(launch, "arch_of", lambda device: SM90)
    monkeypatch.setattr(launch, "validate", functools.partial(real_validate, require_cuda=False))
    # provider="auto" (the default) validates and reads the arch through fa4.tensors, once per shape;
    # its cache of choices starts empty so no earlier test's choice leaks in.
    monkeypatch.setattr(tensors, "arch_of", lambda device: SM90)
    monkeypatch.setattr(tensors, "validate", functools.partial(real_validate, require_cuda=False))
    monkeypatch.setattr(interface, "_chosen", {})
    monkeypatch.setattr(launch, "_bwd_configs", {})
    monkeypatch.setenv("FA4_LOOKUP_LOCAL_DB", "0")
    monkeypatch.delenv("FA4_TUNING_URL", raising=False)
    lookup.reset()
    return calls


def inputs(b=2, sq=33, sk=47, hq=4, hkv=2, d=64, dtype=torch.bfloat16, seed=0, grad=True, dv=None):
    dv = dv or d
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, hq, d, generator=g).to(dtype)
    k = torch.randn(b, sk, hkv, d, generator=g).to(dtype)
    v = torch.randn(b, sk, hkv, dv, generator=g).to(dtype)
    dout = torch.randn(b, sq, hq, dv, generator=g).to(dtype)
    if grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    return q, k, v, dout
