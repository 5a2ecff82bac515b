"""Attention with no work: an empty batch, no query rows, or no keys. Answered without a kernel.

What the reference FA4 returns there, and what a softmax over an empty set means: an output of
zeros (no key contributes), an LSE of -inf per query row (the log of an empty sum), and zero
gradients of the right shapes. A launch with a zero-sized grid is never made.
"""

from __future__ import annotations

import torch

from fa4.tensors import empty_out, validate


def check(q, k, v, out) -> None:
    """The checks the kernels' path makes, minus the ones an empty tensor cannot answer."""
    validate(q, k, v, layout=False, allow_empty=True)
    want = (*q.shape[:3], v.shape[3])
    if out is not None and (tuple(out.shape) != want or out.dtype != q.dtype or out.device != q.device):
        raise ValueError(f"out must be {want} of {q.dtype} on {q.device}, got {tuple(out.shape)} of {out.dtype}")


def _results(q, v, out, sink=None):
    o = out.zero_() if out is not None else empty_out(q, v).zero_()
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), device=q.device, dtype=torch.float32)
    if sink is not None:
        # The sink is the one column of an empty softmax: LSE = sink, as the reference FA4.
        lse.copy_(sink.float()[None, :, None].expand_as(lse))
    return o, lse


class _EmptyAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, out, sink=None):
        o, lse = _results(q, v, out, sink)
        if out is not None:
            ctx.mark_dirty(out)
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, sink)
        return o, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, sink = ctx.saved_tensors
        # A learnable sink (issue 18) gets a zero gradient too, in its own dtype.
        dsink = torch.zeros_like(sink) if sink is not None else None
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None, dsink


def attention(q, k, v, return_lse: bool, out, grad: bool, sink=None):
    """(out, lse) or out for empty inputs; with ``grad``, through autograd (zero gradients, the
    learnable sink's included). ``sink``: the (heads_q,) learnable sink logits, or None."""
    check(q, k, v, out)
    o, lse = _EmptyAttention.apply(q, k, v, out, sink) if grad else _results(q, v, out, sink)
    return (o, lse) if return_lse else o
