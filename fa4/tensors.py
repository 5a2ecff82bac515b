"""What the launch path reads off the tensors: checks, the Problem they pose, their GPU's arch."""

from __future__ import annotations

import contextlib

import torch

from fa4.arch import Arch, arch_from_capability
from fa4.problem import Problem
from fa4.sm90.bwd_config import HEAD_DIMS as BWD_HEAD_DIMS
from fa4.sm90.bwd_config import HEAD_DIMS_V as BWD_HEAD_DIMS_V
from fa4.sm90.fwd_config import HEAD_DIMS, head_dims_v

DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}

_arch_by_device: dict[int, Arch] = {}


def arch_of(device: torch.device) -> Arch:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    arch = _arch_by_device.get(idx)
    if arch is None:
        arch = arch_from_capability(*torch.cuda.get_device_capability(idx))
        _arch_by_device[idx] = arch
    return arch


_NO_GUARD = contextlib.nullcontext()


def device_guard(t: torch.Tensor):
    """The device context of a launch on ``t``'s GPU: none when that GPU is already the current one
    (one GPU per process, the common case), else torch.cuda.device. Building a torch.cuda.device
    costs 2-4.5 us of Python per call (its index parsing), a fifth of the forward's host cost; the
    kernels launch on the current device, so only another GPU needs the switch."""
    idx = t.get_device()
    if idx == torch.cuda.current_device():
        return _NO_GUARD
    return torch.cuda.device(idx)


def tma_ready(t: torch.Tensor) -> bool:
    """What the backward's TMA loads need of dO (and the forward's store of an out= tensor): unit
    inner stride, other strides non-zero multiples of 16 bytes (a broadcast gradient, e.g. of
    out.sum(), has stride 0), a 16-byte aligned base."""
    if t.stride(-1) != 1 or t.data_ptr() % 16:
        return False
    return all(s > 0 and (s * t.element_size()) % 16 == 0 for s in t.stride()[:-1])


def validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, supported_head_dims=HEAD_DIMS,
             require_cuda: bool = True, layout: bool = True, allow_empty: bool = False) -> None:
    """Reject inputs the kernel cannot take, with a message naming the problem (never a launch).

    ``layout=False`` checks shapes and dtypes only (no device, strides or addresses): what
    the custom ops' fake implementations can know while torch.compile traces.
    ``allow_empty`` accepts zero-length sequences (fa4.empty answers those without a kernel).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, seqlen, heads, head_dim), got shape {tuple(t.shape)}")
        if layout and require_cuda and t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}; fa4 kernels run on CUDA devices only")
        if t.dtype not in DTYPES:
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
    if min(q.shape[1], k.shape[1]) < 1 and not allow_empty:
        raise ValueError("sequence lengths must be >= 1")


def is_empty(q: torch.Tensor, k: torch.Tensor) -> bool:
    """No query row or no key: nothing for a kernel to do (an empty batch, a zero-length sequence)."""
    return q.dim() == 4 and k.dim() == 4 and (q.shape[0] == 0 or q.shape[1] == 0 or k.shape[1] == 0)


def bwd_head_dim_error(q, v) -> str | None:
    """Why the backward kernel cannot take these head dims (it covers fewer than the forward)."""
    d, dv = q.shape[3], v.shape[3]
    if d in BWD_HEAD_DIMS and dv in BWD_HEAD_DIMS_V.get(d, (d,)):
        return None
    return (f"fa4's backward supports head_dim {BWD_HEAD_DIMS} with head_dim_v == head_dim (and 192 with 128), "
            f"not head_dim {d}, head_dim_v {dv} (the forward supports it: run it without gradients, e.g. under "
            "torch.no_grad())")


def check_bwd_head_dims(q, v) -> None:
    err = bwd_head_dim_error(q, v)
    if err:
        raise NotImplementedError(err)


def empty_out(q, v) -> torch.Tensor:
    """The output buffer the forward launch allocates: q's layout, head_dim_v wide."""
    if v.shape[3] == q.shape[3]:
        return torch.empty_like(q)
    return q.new_empty((*q.shape[:3], v.shape[3]))


def problem_of(q, k, v, causal: bool, pass_: str = "fwd", deterministic: bool = False, *,
               window_left: int = -1, window_right: int = -1, softcap: float = 0.0, sink: bool = False) -> Problem:
    """The Problem q (B, Sq, Hq, D), k and v (B, Sk, Hkv, D) pose, for either pass (features as
    fa4.features.normalize leaves them)."""
    return Problem(
        batch=q.shape[0], seqlen_q=q.shape[1], seqlen_k=k.shape[1], heads_q=q.shape[2], heads_kv=k.shape[2],
        head_dim=q.shape[3], head_dim_v=v.shape[3], dtype=DTYPES[q.dtype], causal=bool(causal),
        deterministic=bool(deterministic), pass_=pass_, window_left=int(window_left),
        window_right=int(window_right), softcap=float(softcap), sink=bool(sink),
    )
