"""Issue 18's attention features at the API: sliding window, softcap, learnable sinks.

``normalize`` checks ``flash_attn_func``'s window_size / softcap / learnable_sink (the reference
FA4's names and meanings) and puts them in the one form the Problem, the compile key and the
kernel take: window sides as ints with -1 = unbounded, and causal as its own flag (a right bound
of 0). Like the reference, ``causal=True`` sets the right bound to 0 whatever window_size says,
and a window (left, 0) is causal with a left bound; so the problem of a Mistral-style causal
sliding window is the same whichever way it is spelled.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

SINK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class Features(NamedTuple):
    causal: bool
    window_left: int  # -1: unbounded
    window_right: int  # -1: unbounded (causal is its own flag)
    softcap: float  # 0: off
    sink: torch.Tensor | None  # (heads_q,) fp32, contiguous, or None

    @property
    def plain(self) -> bool:
        return self.window_left < 0 and self.window_right < 0 and self.softcap == 0 and self.sink is None

    def names(self) -> list[str]:
        """The features on, by their flash_attn_func argument names."""
        out = []
        if self.window_left >= 0 or self.window_right >= 0:
            out.append("window_size")
        if self.softcap:
            out.append("softcap")
        if self.sink is not None:
            out.append("learnable_sink")
        return out


_UNBOUNDED = (None, None)
_PLAIN = {False: Features(False, -1, -1, 0.0, None), True: Features(True, -1, -1, 0.0, None)}


def _side(name: str, v) -> int:
    if v is None:
        return -1
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"window_size {name} must be None (unbounded) or an int >= 0, got {v!r}")
    return int(v)


def normalize(q: torch.Tensor, causal, window_size, learnable_sink, softcap) -> Features:
    """The checked, canonical features of a call (ValueError naming the argument otherwise)."""
    if learnable_sink is None and softcap == 0.0 and window_size == _UNBOUNDED and causal in (False, True):
        # Plain attention, the common call: one comparison chain, no allocation (~0.1 us).
        return _PLAIN[causal]
    if window_size is None:
        window_size = (None, None)
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size must be a (left, right) pair of ints or None, got {window_size!r}")
    left, right = _side("left", window_size[0]), _side("right", window_size[1])
    causal = bool(causal)
    if causal or right == 0:
        # The reference's rule: causal means right = 0; and (left, 0) is the causal window.
        causal, right = True, -1
    if softcap is None:
        softcap = 0.0
    # A comparison chain, not math.isfinite: under torch.compile a float may be symbolic, and dynamo
    # guards on a comparison where it cannot trace isfinite (NaN and inf fail the chain too).
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not 0 <= softcap < math.inf:
        raise ValueError(f"softcap must be a finite number >= 0 (0 = off), got {softcap!r}")
    sink = learnable_sink
    if sink is not None:
        if not isinstance(sink, torch.Tensor):
            raise ValueError(f"learnable_sink must be a torch.Tensor of shape (heads_q,), got {type(sink).__name__}")
        heads = q.shape[2] if q.dim() == 4 else None
        if sink.dim() != 1 or sink.shape[0] != heads:
            raise ValueError(f"learnable_sink must have shape (heads_q,) = ({heads},), got {tuple(sink.shape)}")
        if sink.dtype not in SINK_DTYPES:
            raise ValueError(f"learnable_sink must be float32, bfloat16 or float16, got {sink.dtype}")
        if sink.device != q.device:
            raise ValueError(f"learnable_sink is on {sink.device}, q on {q.device}: they must share a device")
        # Under torch.compile a tensor has no address to check: always copy (heads_q floats).
        if (torch.compiler.is_compiling() or sink.dtype != torch.float32 or not sink.is_contiguous()
                or sink.data_ptr() % 16):
            # The kernel reads (heads_q,) fp32 from a 16-byte aligned base (a slice may not be).
            sink = sink.to(torch.float32, copy=True).contiguous()
    return Features(causal, left, right, float(softcap), sink)


def window_size(left: int, right: int) -> tuple[int | None, int | None]:
    """The reference's window_size of canonical bounds (-1: an unbounded side, None there)."""
    return (None if left < 0 else left), (None if right < 0 else right)


def problem_fields(f: Features) -> dict:
    """The Problem fields of the features (fa4.problem.Problem's window_left ... sink)."""
    return {"window_left": f.window_left, "window_right": f.window_right, "softcap": f.softcap,
            "sink": f.sink is not None}
