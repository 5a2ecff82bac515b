"""The attention problem a kernel is asked to solve."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

DTYPES = ("bf16", "fp16")
PASSES = ("fwd", "bwd")


@dataclass(frozen=True)
class Problem:
    """One attention shape. Layout of q/k/v is (batch, seqlen, heads, head_dim).

    ``pass_`` is "fwd" (forward only) or "bwd" (forward + backward timed as the
    backward); it is spelled ``pass`` in JSON, the CLI and the database.

    Issue 18's features (the reference FA4's semantics, offset o = seqlen_k - seqlen_q): query
    row i sees key j iff j <= i + o + window_right and j >= i + o - window_left, each bound
    only when it is >= 0 (-1 = unbounded; ``causal`` stays its own flag and means a right
    bound of 0). ``softcap`` c > 0 replaces each scaled score s by c * tanh(s / c); ``sink``
    adds a learnable per-head logit to every softmax denominator. At their defaults they
    leave the key, the dict and the DB row of a plain problem unchanged.

    Packed variable-length sequences (``varlen``): ``batch`` is the number of sequences,
    seqlen_q/seqlen_k the longest one's lengths (the grid's extent), and ``varlen_mean_q``/
    ``varlen_mean_k`` the mean lengths (rounded; 0 when not varlen), what tells a packed batch of
    many short documents from one of few long ones. The mask applies per sequence. The lengths a
    measurement packs (and its FLOPs count) are ``varlen_seqlens()``: fixed by these three numbers.
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
    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    sink: bool = False
    varlen: bool = False
    varlen_mean_q: int = 0
    varlen_mean_k: int = 0

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
        for name in ("window_left", "window_right"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < -1:
                e.append(f"{name} must be an integer >= 0, or -1 for unbounded, got {v!r}")
        if (isinstance(self.softcap, bool) or not isinstance(self.softcap, (int, float))
                or not math.isfinite(self.softcap) or self.softcap < 0):
            e.append(f"softcap must be a finite number >= 0 (0 = off), got {self.softcap!r}")
        if not isinstance(self.sink, bool):
            e.append(f"sink must be a bool, got {self.sink!r}")
        if not isinstance(self.varlen, bool):
            e.append(f"varlen must be a bool, got {self.varlen!r}")
        for name, top in (("varlen_mean_q", self.seqlen_q), ("varlen_mean_k", self.seqlen_k)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                e.append(f"{name} must be an integer, got {v!r}")
            elif self.varlen is True and not (isinstance(top, int) and 1 <= v <= top):
                e.append(f"{name} must be in [1, {'seqlen_q' if name.endswith('q') else 'seqlen_k'}] for varlen, "
                         f"got {v!r}")
            elif self.varlen is not True and v != 0:
                e.append(f"{name} is a varlen field (0 when varlen is off), got {v!r}")
        return e

    @property
    def has_window(self) -> bool:
        return self.window_left >= 0 or self.window_right >= 0

    def visible_pairs(self) -> int:
        """(query row, key) pairs the mask lets through, per batch and head: the unmasked region."""
        o = self.seqlen_k - self.seqlen_q
        right = self.window_right if self.window_right >= 0 else None
        if self.causal:
            right = 0 if right is None else min(right, 0)
        left = self.window_left if self.window_left >= 0 else None
        return visible_pairs(self.seqlen_q, self.seqlen_k, o, left, right)

    def varlen_seqlens(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(query lengths, key lengths) of the packed sequences a varlen problem stands for, in
        packing order (sequence b's queries attend to sequence b's keys): varlen_lengths of each
        side. ValueError when the problem is not varlen or its mean cannot be met."""
        if not self.varlen:
            raise ValueError("varlen_seqlens() is for varlen problems")
        return (varlen_lengths(self.batch, self.seqlen_q, self.varlen_mean_q),
                varlen_lengths(self.batch, self.seqlen_k, self.varlen_mean_k))

    @classmethod
    def standard(cls, seqlen: int, head_dim: int, **kw) -> "Problem":
        """The benchmark convention: batch*seqlen = 16k tokens, heads*head_dim = 2048.

        Varlen (``varlen_mean_q`` given; ``varlen`` follows): ``seqlen`` is the longest sequence, the
        default batch holds 16k tokens in all (16384 // varlen_mean_q sequences) and the key side's
        mean defaults to the query side's, scaled by seqlen_k / seqlen."""
        seqlen_k = kw.pop("seqlen_k", None) or seqlen
        if kw.get("varlen_mean_q"):
            kw.setdefault("varlen", True)
            if not kw.get("varlen_mean_k"):
                kw["varlen_mean_k"] = default_varlen_mean_k(kw["varlen_mean_q"], seqlen, seqlen_k)
        tokens = kw["varlen_mean_q"] if kw.get("varlen") and kw.get("varlen_mean_q") else seqlen
        batch = kw.pop("batch", None) or max(1, 16384 // tokens)
        heads = kw.pop("heads_q", None) or max(1, 2048 // head_dim)
        heads_kv = kw.pop("heads_kv", None) or heads
        return cls(
            batch=batch,
            seqlen_q=seqlen,
            seqlen_k=seqlen_k,
            heads_q=heads,
            heads_kv=heads_kv,
            head_dim=head_dim,
            head_dim_v=kw.pop("head_dim_v", None) or head_dim,
            **kw,
        )

    @property
    def flops(self) -> float:
        """FLOPs counted by the FlashAttention convention (causal halves, bwd = 2.5x fwd). Varlen:
        the sum over the packed sequences (varlen_seqlens(), what a measurement runs), each counted
        as a dense sequence of its own lengths; B sequences of the mean lengths where the mean
        cannot be met (a problem no provider measures)."""
        if self.varlen:
            dense = functools.partial(dataclasses.replace, self, batch=1, varlen=False, varlen_mean_q=0,
                                      varlen_mean_k=0)
            try:
                lens_q, lens_k = self.varlen_seqlens()
            except ValueError:
                return self.batch * dense(seqlen_q=self.varlen_mean_q, seqlen_k=self.varlen_mean_k).flops
            return sum(dense(seqlen_q=a, seqlen_k=b).flops for a, b in zip(lens_q, lens_k))
        f = 2.0 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * (self.head_dim + self.head_dim_v)
        if self.has_window:
            # Windows count only the unmasked region (the reference's benchmark convention).
            f = 2.0 * self.batch * self.heads_q * self.visible_pairs() * (self.head_dim + self.head_dim_v)
        elif self.causal:
            f /= 2
        if self.pass_ == "bwd":
            f *= 2.5
        return f

    def kernel_flags(self) -> dict:
        """The compile-time feature switches of the kernels (compile keys' keywords)."""
        return {"has_window_left": self.window_left >= 0, "has_window_right": self.window_right >= 0,
                "has_softcap": self.softcap > 0, "has_sink": self.sink}

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["pass"] = d.pop("pass_")
        return d

    def features(self) -> dict:
        """The issue-18 fields that differ from their defaults (none for a plain problem)."""
        return {f: getattr(self, f) for f, default in FEATURE_DEFAULTS.items() if getattr(self, f) != default}

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
            + self._feature_key()
        )

    def _feature_key(self) -> str:
        # Only the non-default features, so the keys (and study names) of plain problems stay as they were.
        f = self.features()
        out = ""
        if "window_left" in f or "window_right" in f:
            out += f"_win{self.window_left}_{self.window_right}"
        if "softcap" in f:
            out += f"_cap{self.softcap:g}"
        if "sink" in f:
            out += "_sink"
        if "varlen" in f:
            out += f"_varlen{self.varlen_mean_q}_{self.varlen_mean_k}"
        return out


FEATURE_DEFAULTS = {"window_left": -1, "window_right": -1, "softcap": 0.0, "sink": False, "varlen": False,
                    "varlen_mean_q": 0, "varlen_mean_k": 0}


def default_varlen_mean_k(varlen_mean_q: int, seqlen_q: int, seqlen_k: int) -> int:
    """The key side's mean length when only the query side's is given: the same shape of
    distribution, scaled by seqlen_k / seqlen_q (equal for self-attention)."""
    return max(1, round(varlen_mean_q * seqlen_k / seqlen_q))


@functools.lru_cache(maxsize=256)
def varlen_lengths(batch: int, max_len: int, mean_len: int) -> tuple[int, ...]:
    """The lengths of ``batch`` packed sequences whose longest is ``max_len`` and whose mean is
    exactly ``mean_len`` (sum = batch * mean_len, so the launch's rounded mean total / batch is it
    too): one sequence of max_len, the other batch - 1 spread evenly around their own mean, as
    widely as [1, max_len] allows; ascending, the longest last. Deterministic (a pure function:
    a varlen Problem's key fixes what is measured). ValueError when no such lengths exist: every
    sequence is at least 1 long, so mean_len * batch >= max_len + batch - 1, and a single
    sequence has mean_len == max_len."""
    for name, v in (("batch", batch), ("max_len", max_len), ("mean_len", mean_len)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if mean_len > max_len:
        raise ValueError(f"mean length {mean_len} exceeds the longest {max_len}")
    n = batch - 1
    rest = mean_len * batch - max_len  # what the other sequences hold, 0 <= rest <= n * max_len
    if rest < n or (n == 0 and rest != 0):
        least = max_len if n == 0 else -(-(max_len + n) // batch)
        raise ValueError(f"{batch} sequences with a longest of {max_len} (each at least 1) have a mean of at "
                         f"least {least}, not {mean_len}")
    if n == 0:
        return (max_len,)
    mid = rest / n
    half = min(mid - 1, max_len - mid)
    lens = [round(mid - half + 2 * half * i / (n - 1)) if n > 1 else round(mid) for i in range(n)]
    # Rounding leaves the sum off by at most n / 2: one unit at a time onto sequences with room.
    diff = rest - sum(lens)
    while diff:
        step = 1 if diff > 0 else -1
        for i in range(n - 1, -1, -1) if step > 0 else range(n):
            if diff and 1 <= lens[i] + step <= max_len:
                lens[i] += step
                diff -= step
    return (*sorted(lens), max_len)


def visible_pairs(seqlen_q: int, seqlen_k: int, offset: int, left: int | None, right: int | None) -> int:
    """Sum over query rows i of the keys j in [0, seqlen_k) with i + offset - left <= j <= i + offset + right."""
    total = 0
    for i in range(seqlen_q):
        hi = seqlen_k - 1 if right is None else min(seqlen_k - 1, i + offset + right)
        lo = 0 if left is None else max(0, i + offset - left)
        total += max(0, hi - lo + 1)
    return total
