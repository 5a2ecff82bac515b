"""The decode (KV-cache) attention problem a kernel is asked to solve.

A decode step: ``seqlen_q`` new query tokens per sequence (1 for plain decoding, a few for
speculative decoding, more for appends) against a KV cache of at most ``seqlen_k`` keys per
sequence, held in pages of ``page_size`` keys (0: one contiguous cache per sequence). The
valid lengths are device data (cache_seqlens) the host never reads; ``seqlen_k_mean`` is their
mean where the caller knows it (0: unknown), so a tuner can tell a ragged batch from a full one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fa4.problem import DTYPES, Problem


@dataclass(frozen=True)
class DecodeProblem:
    batch: int
    seqlen_q: int  # new query tokens per sequence
    seqlen_k: int  # KV capacity per sequence (max_pages * page_size when paged)
    heads_q: int
    heads_kv: int
    head_dim: int
    page_size: int = 0  # 0: not paged
    seqlen_k_mean: int = 0  # mean of cache_seqlens when known, 0 otherwise
    dtype: str = "bf16"
    causal: bool = False

    def __post_init__(self):
        errs = self.errors()
        if errs:
            raise ValueError("; ".join(errs))

    def errors(self) -> list[str]:
        e = []
        for name in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                e.append(f"{name} must be a positive integer, got {v!r}")
        for name in ("page_size", "seqlen_k_mean"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                e.append(f"{name} must be a non-negative integer, got {v!r}")
        if not e and self.heads_q % self.heads_kv:
            e.append(f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})")
        if not e and self.seqlen_k_mean > self.seqlen_k:
            e.append(f"seqlen_k_mean ({self.seqlen_k_mean}) exceeds seqlen_k ({self.seqlen_k})")
        if self.dtype not in DTYPES:
            e.append(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        return e

    @property
    def paged(self) -> bool:
        return self.page_size > 0

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads_q // self.heads_kv

    @property
    def kv_bytes(self) -> int:
        """K and V bytes a step reads at full (or mean, when known) cache length."""
        keys = self.seqlen_k_mean or self.seqlen_k
        return 2 * self.batch * keys * self.heads_kv * self.head_dim * 2

    kind = "decode"  # not a field: how dicts, the store and the tuner tell it from an attention Problem

    def to_dict(self) -> dict:
        return {"kind": self.kind, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "DecodeProblem":
        d = dict(d)
        kind = d.pop("kind", cls.kind)
        if kind != cls.kind:
            raise ValueError(f"not a decode problem (kind {kind!r})")
        return cls(**d)

    @property
    def flops(self) -> float:
        """FLOPs of QK^T and PV over the (mean, when known) cache: what a TFLOP/s column would count."""
        keys = self.seqlen_k_mean or self.seqlen_k
        return 4.0 * self.batch * self.heads_q * self.seqlen_q * keys * self.head_dim

    def key(self) -> str:
        """A stable human-readable identity, used for study names and caches."""
        page = f"p{self.page_size}" if self.page_size else "contig"
        mean = f"_skm{self.seqlen_k_mean}" if self.seqlen_k_mean else ""
        return (
            f"decode_b{self.batch}_sq{self.seqlen_q}_sk{self.seqlen_k}{mean}_hq{self.heads_q}_hkv{self.heads_kv}"
            f"_d{self.head_dim}_{page}_{self.dtype}_{'causal' if self.causal else 'full'}"
        )


def problem_from_dict(d: dict) -> "Problem | DecodeProblem":
    """An attention Problem or (``"kind": "decode"``) a DecodeProblem from its dict."""
    kind = d.get("kind", "attention")
    if kind == DecodeProblem.kind:
        return DecodeProblem.from_dict(d)
    if kind != "attention":
        raise ValueError(f"problem kind must be 'attention' or 'decode', got {kind!r}")
    return Problem.from_dict({k: v for k, v in d.items() if k != "kind"})
