"""Per-shape dispatch: ``flash_attn_func(..., provider="auto")`` runs the fastest measured implementation.

For a problem with stored measurements of several providers on this device (ours; the
reference FA4, ``flash-attn-4``, when it is installed; cuDNN and FlashAttention-2 through
PyTorch's SDPA), a call runs the fastest one that passed the tuner's correctness gate, in the
timing mode a launch asks for (fa4.lookup.launch_timing). The numbers come from the config
sources the launch-time lookup asks (the local results DB); a choice is made once per
(problem, deterministic, timing mode) per process and cached, so a dispatched call costs one
dict lookup more than a plain one.

Forward and backward are chosen separately where their saved state allows it:
  - a call without grad runs the fastest forward;
  - a call with grad runs, for one provider, its forward and its backward (each provider's
    backward consumes what its own forward saved: SDPA's backends keep their own state, and
    no LSE is returned by them), the provider with the least measured forward + backward time.
    A deterministic request counts only deterministic backward measurements (SDPA's backends
    have none).
A provider without both numbers is not a candidate for that call; a peer runs only where fa4
was measured too (and was slower), else fa4 runs. ``provider="auto"`` is flash_attn_func's
default, so a call dispatches away from our kernels only on this device's own measurements.

Host cost counts where the launch is eager: a cold-L2 measurement (the default mode) times the
GPU's work alone (the tuner's harness lets the GPU sleep through the call's host path after each
flush), so a provider whose Python path costs more than its kernels looks faster in it than it
runs in a loop. Where the DB also holds the provider's eager-warm rows (back-to-back
calls, nothing in between: a host-bound call's time there is its host cost), each pass is
charged the slower of its two numbers (``fa4-tune --l2 warm`` measures them; bench/auto_dispatch.py
--measure takes both modes). ``fa4.explain_auto`` (and ``fa4.explain(..., provider="auto")``) names the choice and its
numbers.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field, replace

from fa4.arch import Arch
from fa4.problem import Problem

PROVIDERS = ("fa4", "flash-attn-4", "cudnn", "fa2")
PEERS = PROVIDERS[1:]
# SDPA's backend names for the two peers reached through it.
SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "fa2": "FLASH_ATTENTION"}


def problem_errors(provider: str, problem: Problem, return_lse: bool = False) -> list[str]:
    """Why ``provider`` cannot run ``problem`` as fa4 defines it (empty: it can)."""
    e = []
    if provider in SDPA_BACKENDS:
        if problem.causal and problem.seqlen_q != problem.seqlen_k:
            # SDPA's is_causal is aligned top-left; fa4's (and the reference's) bottom-right.
            e.append("SDPA's causal mask is top-left aligned; fa4's is bottom-right when seqlen_q != seqlen_k")
        if problem.head_dim != problem.head_dim_v:
            e.append("SDPA needs head_dim == head_dim_v")
        if return_lse:
            e.append("SDPA returns no LSE")
        if problem.pass_ == "bwd" and problem.deterministic:
            e.append("SDPA's backends have no deterministic backward")
    elif provider not in PROVIDERS:
        e.append(f"unknown provider {provider!r} (known: {', '.join(PROVIDERS)}, or 'auto')")
    return e


@dataclass(frozen=True)
class Choice:
    """What provider="auto" runs for one problem: ``fwd`` without grad, ``train`` with grad."""

    fwd: str
    train: str
    # provider -> measured forward / backward milliseconds (only the measured ones).
    fwd_ms: dict = field(default_factory=dict)
    bwd_ms: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    timing: str = ""

    def __str__(self) -> str:
        def ms(d):
            return ", ".join(f"{p} {t:.3f} ms" for p, t in sorted(d.items(), key=lambda kv: kv[1])) or "none"

        lines = [f"forward (no grad): {self.fwd}", f"forward + backward (grad): {self.train}",
                 f"timing: {self.timing}", f"  measured forward:  {ms(self.fwd_ms)}",
                 f"  measured backward: {ms(self.bwd_ms)}"]
        return "\n".join(lines + [f"  {n}" for n in self.notes])


def decide(fwd_ms: dict, bwd_ms: dict, runnable_fwd, runnable_train, notes=(), timing: str = "") -> Choice:
    """The rule, a pure function of measured milliseconds per provider (fa4 when nothing counts)."""
    notes = list(notes)
    fwd_c = {p: t for p, t in fwd_ms.items() if p in runnable_fwd and math.isfinite(t)}
    train_c = {p: fwd_ms[p] + bwd_ms[p] for p in runnable_train
               if p in fwd_ms and p in bwd_ms and math.isfinite(fwd_ms[p] + bwd_ms[p])}
    return Choice(_fastest(fwd_c, "forward", notes), _fastest(train_c, "forward + backward", notes), dict(fwd_ms),
                  dict(bwd_ms), tuple(notes), timing)


def _fastest(ms: dict, what: str, notes: list) -> str:
    """The least of ``ms``, a tie to fa4; fa4 without its own measurement: a peer replaces ours
    only where both were measured (auto is the default provider: a DB holding one peer's rows
    alone must not move every call of the shape off our kernels)."""
    if "fa4" not in ms:
        notes.append(f"no {what} measurement of fa4 to compare with: fa4 runs"
                     + (f" (measured: {', '.join(sorted(ms))})" if ms else ""))
        return "fa4"
    return min(ms, key=lambda p: (ms[p], p != "fa4"))


_cache: dict = {}
_lock = threading.Lock()


def reset() -> None:
    with _lock:
        _cache.clear()


def choose(problem: Problem, arch: Arch, *, return_lse: bool = False, device: str | None = None,
           timing: str | None = None, remember: bool = True) -> Choice:
    """The choice for a forward ``problem`` (its ``deterministic`` flag selects the backward rows)."""
    from fa4 import lookup

    timing = lookup.launch_timing() if timing is None else timing
    key = (problem, arch, return_lse, timing)
    hit = _cache.get(key) if device is None else None
    if hit is not None:
        return hit
    fwd_p = replace(problem, pass_="fwd", deterministic=False)
    bwd_p = replace(problem, pass_="bwd")
    notes: list[str] = []
    fwd_ms, bwd_ms = {}, {}
    if device is None:
        device, why = lookup._device_name()
        if device is None:
            notes.append(why)
    if device is not None:
        fwd_ms = _measured_ms(fwd_p, device, timing, notes)
        bwd_ms = _measured_ms(bwd_p, device, timing, notes)
        back_to_back = _back_to_back(timing)
        if back_to_back is not None:
            fwd_ms = _slower(fwd_ms, _measured_ms(fwd_p, device, back_to_back, notes), "fwd", notes)
            bwd_ms = _slower(bwd_ms, _measured_ms(bwd_p, device, back_to_back, notes), "bwd", notes)
    runnable_fwd = [p for p in PROVIDERS if not problem_errors(p, fwd_p, return_lse) and _installed(p, notes)]
    runnable_train = [p for p in PROVIDERS if not problem_errors(p, bwd_p, return_lse) and _installed(p, notes)]
    for p in PROVIDERS:
        for why in problem_errors(p, bwd_p, return_lse):
            notes.append(f"{p} not a candidate: {why}")
    choice = decide(fwd_ms, bwd_ms, runnable_fwd, runnable_train, notes, timing)
    if remember and device is not None:
        with _lock:
            _cache[key] = choice
    return choice


def _back_to_back(timing: str) -> str | None:
    """The mode whose numbers carry an eager call's host cost, when ``timing`` hides it (eager with a
    cold L2); None for modes that show it already (eager-warm) or have none (CUDA graphs)."""
    from fa4.timing import Timing

    t = Timing.parse(timing)
    return Timing("eager", "warm").name if not t.graph and t.flush_l2 else None


def _slower(ms: dict, back_to_back: dict, pass_: str, notes: list) -> dict:
    """Per provider, the slower of its ``timing`` number and its back-to-back one (where measured)."""
    out = dict(ms)
    for p, t in back_to_back.items():
        if p in out and t > out[p]:
            notes.append(f"{pass_} {p}: back-to-back calls take {t:.3f} ms > {out[p]:.3f} ms with the L2 flushed "
                         "(host-bound): the slower counts")
            out[p] = t
    return out


def _measured_ms(problem: Problem, device: str, timing: str, notes: list) -> dict:
    """provider -> median ms of its plain call on ``problem``, from the first source that knows."""
    from fa4 import lookup

    if not lookup.local_sources_enabled():
        notes.append(f"{problem.pass_}: the local results DB is not asked ({lookup.LOCAL_DB_ENV}=0)")
        return {}
    fp = lookup._fingerprint()
    for src in lookup._sources():
        speeds = getattr(src, "speeds", None)
        if speeds is None:
            continue
        try:
            found = speeds(problem, device, fp, timing, PROVIDERS)
        except Exception as e:
            notes.append(f"{src.name}: {type(e).__name__}: {e}")
            continue
        for p, row in sorted(found.items()):
            notes.append(f"{problem.pass_} {p}: {row['tflops']:.1f} TFLOP/s, {row['median_ms']:.3f} ms "
                         f"({row['what']}, measurement {row['measurement_id']}, {src.name})")
        return {p: row["median_ms"] for p, row in found.items() if row.get("median_ms") is not None}
    notes.append(f"no config source could give {problem.pass_} measurements of {problem.key()}")
    return {}


_installed_cache: dict = {}


def _installed(provider: str, notes: list) -> bool:
    if provider != "flash-attn-4":
        return True
    if provider not in _installed_cache:
        import importlib.util

        try:
            ok = importlib.util.find_spec("flash_attn.cute") is not None
        except (ImportError, ValueError):
            ok = False
        _installed_cache[provider] = ok
    if not _installed_cache[provider]:
        notes.append("flash-attn-4 not a candidate: flash_attn.cute is not installed")
    return _installed_cache[provider]


# -- the peers' calls, in fa4's layout (B, S, H, D) ------------------------------------------


def run_peer(provider: str, q, k, v, softmax_scale, causal: bool, return_lse: bool, deterministic: bool):
    """``provider``'s plain call (autograd included), returning what flash_attn_func returns."""
    if provider == "flash-attn-4":
        from flash_attn.cute import flash_attn_func as reference

        res = reference(q, k, v, softmax_scale=softmax_scale, causal=causal, deterministic=deterministic,
                        return_lse=return_lse)
        out, lse = res if isinstance(res, tuple) else (res, None)
        return (out, lse) if return_lse else out
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if return_lse:
        raise ValueError(f"{provider} returns no LSE")
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    with sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[provider])]):
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=softmax_scale,
                                           enable_gqa=q.shape[2] != k.shape[2])
    return o.transpose(1, 2)
