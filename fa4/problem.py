"""The attention problem a kernel is asked to solve."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DTYPES = ("bf16", "fp16")
PASSES = ("fwd", "bwd")


@dataclass(frozen=True)
class Problem:
    """One attention shape. Layout of q/k/v is (batch, seqlen, heads, head_dim).

    ``pass_`` is "fwd" (forward only) or "bwd" (forward + backward timed as the
    backward); it is spelled ``pass`` in JSON, the CLI and the database.
    """

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    head_dim_v: int
    dtype: str = "bf16"
    causal: bool = False
    deterministic: bool = False
    pass_: str = "fwd"

    def __post_init__(self):
        errs = self.errors()
        if errs:
            raise ValueError("; ".join(errs))

    def errors(self) -> list[str]:
        e = []
        for name in ("batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "head_dim_v"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                e.append(f"{name} must be a positive integer, got {v!r}")
        if not e and self.heads_q % self.heads_kv != 0:
            e.append(f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})")
        if self.dtype not in DTYPES:
            e.append(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.pass_ not in PASSES:
            e.append(f"pass must be one of {PASSES}, got {self.pass_!r}")
        return e

    @classmethod
    def standard(cls, seqlen: int, head_dim: int, **kw) -> "Problem":
        """The benchmark convention: batch*seqlen = 16k tokens, heads*head_dim = 2048."""
        batch = kw.pop("batch", None) or max(1, 16384 // seqlen)
        heads = kw.pop("heads_q", None) or max(1, 2048 // head_dim)
        heads_kv = kw.pop("heads_kv", None) or heads
        return cls(
            batch=batch,
            seqlen_q=seqlen,
            seqlen_k=kw.pop("seqlen_k", None) or seqlen,
            heads_q=heads,
            heads_kv=heads_kv,
            head_dim=head_dim,
            head_dim_v=kw.pop("head_dim_v", None) or head_dim,
            **kw,
        )

    @property
    def flops(self) -> float:
        """FLOPs counted by the FlashAttention convention (causal halves, bwd = 2.5x fwd)."""
        f = 2.0 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * (self.head_dim + self.head_dim_v)
        if self.causal:
            f /= 2
        if self.pass_ == "bwd":
            f *= 2.5
        return f

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["pass"] = d.pop("pass_")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Problem":
        d = dict(d)
        if "pass" in d:
            d["pass_"] = d.pop("pass")
        return cls(**d)

    def key(self) -> str:
        """A stable human-readable identity, used for study names and caches."""
        return (
            f"b{self.batch}_sq{self.seqlen_q}_sk{self.seqlen_k}_hq{self.heads_q}_hkv{self.heads_kv}"
            f"_d{self.head_dim}_dv{self.head_dim_v}_{self.dtype}_{'causal' if self.causal else 'full'}"
            f"_{'det' if self.deterministic else 'nondet'}_{self.pass_}"
        )
