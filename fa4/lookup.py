"""Launch-time config resolution: which knob values a launch uses, and why.

Every lookup is for one timing mode (fa4.timing), and only measurements of that mode answer it:
``$FA4_TUNING_TIMING`` (default ``eager-cold``) names it, and a launch made while the current CUDA
stream is capturing a graph (``torch.cuda.is_current_stream_capturing()``) asks for ``graph-`` with
the L2 state ``$FA4_TUNING_TIMING`` names, whatever its launch part says.

Order (first that answers wins):
  1. an explicit ``config=`` passed by the caller (handled by fa4.launch);
  2. the in-process cache, keyed by (problem, arch, timing mode): a hit is a dict lookup;
  3. the config sources installed beside the kernels (entry point group
     ``fa4.config_sources``): fa4-tune's results store offers the local results DB ($FA4_DB,
     or the default file when it exists), the best current measurement of provider "fa4"
     for this device and exact problem, used only when its source fingerprint matches the
     running kernel code (fa4.fingerprint);
  4. the tuning service when $FA4_TUNING_URL is set (GET /v1/configs/best, or /best-decode
     for a DecodeProblem): one HTTP call per problem class per process, 0.5 s timeout ($FA4_TUNING_TIMEOUT_S); after a failure the service is
     left alone for 60 s;
  5. the heuristic default of the kernel's knob declaration.

The same chain serves both passes: a Problem with ``pass_="bwd"`` (and its
``deterministic`` flag) resolves to the backward's knob class through
:func:`fa4.dispatch.bwd_entry`, measurements of the "fa4" provider's bwd pass. It serves
decode too: a :class:`fa4.decode_problem.DecodeProblem` resolves to the decode kernel's knob
class (:func:`fa4.dispatch.decode_entry`) from measurements of provider "fa4-decode", exact
shape and current kernel source only, the service's through GET /v1/configs/best-decode (its
query: the DecodeProblem's fields) under the same rules as attention's.

Nothing here may raise into a launch: every DB or HTTP problem becomes a step of
the provenance chain (see :func:`explain_problem`) and the default is used.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fa4.arch import SM90, Arch
from fa4.decode_problem import DecodeProblem
from fa4.dispatch import bwd_entry, decode_entry, fwd_entry
from fa4.problem import Problem
from fa4.timing import DEFAULT_TIMING, Timing

PROVIDER = "fa4"
DECODE_PROVIDER = "fa4-decode"
# The timing mode lookups ask for (fa4.timing: eager-cold, eager-warm, graph-cold, graph-warm); a
# launch under CUDA-graph capture asks for graph mode with this setting's L2 state.
TIMING_ENV = "FA4_TUNING_TIMING"
URL_ENV = "FA4_TUNING_URL"
DEVICE_ENV = "FA4_DEVICE_NAME"
# Set to 0 to skip the local results DB (e.g. a read-only home directory on a cluster).
LOCAL_DB_ENV = "FA4_LOOKUP_LOCAL_DB"
# A launch waits at most this long for the service once per problem class; a busy host
# (or a service across a WAN) may need more, set in seconds through TIMEOUT_ENV.
TIMEOUT_ENV = "FA4_TUNING_TIMEOUT_S"
HTTP_TIMEOUT_S = 0.5
SERVICE_RETRY_S = 60.0
# Entry point group of the config sources asked between the cache and the service: fa4-tune's
# results store declares its local DB there, so the kernels reach it without importing it.
SOURCES_GROUP = "fa4.config_sources"
# Sources registered in-process with register_source(), asked after the installed ones.
_registered: list = []


@dataclass(frozen=True)
class Step:
    """One source asked during resolution and what it said."""

    source: str  # "explicit", "cache", "local-db", "service", "default"
    outcome: str  # "used", "miss", "skipped", "error", "stale"
    detail: str = ""


@dataclass(frozen=True)
class SourceAnswer:
    """What a config source (the results store, through SOURCES_GROUP) says about one problem.

    ``outcome`` is a Step outcome; with "used", ``config`` is the measured knob dict (checked
    here against the running knob class and feasibility before a launch uses it) and ``ref``
    names the row in messages.
    """

    outcome: str
    detail: str = ""
    config: dict | None = None
    ref: str = ""
    tflops: float | None = None
    measured_problem: dict | None = None


@dataclass(frozen=True)
class Resolution:
    config: Any
    provenance: str  # the source that supplied the config
    steps: tuple[Step, ...]
    # Measured numbers of the served config when a DB or the service had them.
    tflops: float | None = None
    measured_problem: dict | None = None
    # monotonic() time after which this answer is asked again; inf: for the process lifetime.
    expires: float = math.inf
    # The timing mode asked for (fa4.timing); measurements of other modes never answer.
    timing: str = DEFAULT_TIMING

    def __str__(self) -> str:
        lines = [f"config: {self.config}", f"from: {self.provenance}"
                 + (f" ({self.tflops:.1f} TFLOP/s measured)" if self.tflops is not None else ""),
                 f"timing: {self.timing}"]
        lines += [f"  {s.source:9s} {s.outcome:8s} {s.detail}" for s in self.steps]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        from fa4.knobs import config_to_dict

        return {
            "config": config_to_dict(self.config) if self.config is not None else None,
            "provenance": self.provenance,
            "timing": self.timing,
            "tflops": self.tflops,
            "measured_problem": self.measured_problem,
            "chain": [{"source": s.source, "outcome": s.outcome, "detail": s.detail} for s in self.steps],
        }


@dataclass
class _State:
    cache: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Problem classes already sent to the service (at most one call each per process).
    asked: set = field(default_factory=set)
    service_down_until: float = 0.0
    service_down_reason: str = ""
    sources: list | None = None
    source_errors: list = field(default_factory=list)
    fingerprint: str | None = None
    fingerprint_error: str | None = None
    fingerprint_done: bool = False
    # $FA4_TUNING_TIMING as last read: (raw text, its mode, why it was not understood or None).
    timing_env: tuple = (None, Timing(), None)
    # False once asking torch whether the stream captures failed (a torch without CUDA).
    capture_check: bool = True


_state = _State()


def reset() -> None:
    """Forget every cached answer, the open DB and remembered failures (tests, or after re-tuning)."""
    global _state
    old = _state
    _state = _State()
    for src in old.sources or ():
        try:
            src.close()
        except Exception:
            pass


def entry_for(problem: Problem | DecodeProblem, arch: Arch):
    """The dispatch entry (knob class, feasibility, default) of ``problem``'s pass on ``arch``."""
    if isinstance(problem, DecodeProblem):
        return decode_entry(arch)
    return bwd_entry(arch) if problem.pass_ == "bwd" else fwd_entry(arch)


def _configured_timing() -> tuple[Timing, str | None]:
    """The mode $FA4_TUNING_TIMING names (the default when unset) and why it was not understood."""
    st = _state
    raw = os.environ.get(TIMING_ENV)
    if raw != st.timing_env[0]:
        try:
            st.timing_env = (raw, Timing.parse(raw) if raw and raw.strip() else Timing(), None)
        except ValueError as e:
            st.timing_env = (raw, Timing(), f"{TIMING_ENV}={raw!r}: {e}; using {DEFAULT_TIMING}")
    return st.timing_env[1], st.timing_env[2]


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (never initialises CUDA)."""
    st = _state
    if not st.capture_check:
        return False
    torch = sys.modules.get("torch")  # a launch has its tensors' torch imported
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:  # a torch built without CUDA: nothing here ever captures
        st.capture_check = False
        return False


def launch_timing() -> str:
    """The timing mode a launch made now asks for: $FA4_TUNING_TIMING's, or graph mode (with its
    L2 state) while the current stream is capturing a CUDA graph."""
    mode, _ = _configured_timing()
    if not mode.graph and _capturing():
        mode = Timing("graph", mode.l2)
    return mode.name


def launch_timings() -> tuple[str, ...]:
    """Every timing mode a launch in this process can ask for now: the configured one and, when it is
    eager, its graph twin (what a launch under CUDA-graph capture asks)."""
    mode, _ = _configured_timing()
    return (mode.name,) if mode.graph else (mode.name, Timing("graph", mode.l2).name)


def _cached_or_resolved(problem: Problem, arch: Arch):
    timing = launch_timing()
    hit = _state.cache.get((problem, arch, timing))
    if hit is not None and (hit.expires == math.inf or hit.expires > time.monotonic()):
        return hit.config
    return _resolve(problem, arch, None, timing).config


def resolve_fwd_config(problem: Problem, arch: Arch):
    """The forward config a launch of ``problem`` on ``arch`` uses (no explicit config given)."""
    if problem.pass_ != "fwd":
        raise ValueError(f"resolve_fwd_config needs a fwd problem, got pass {problem.pass_!r}")
    return _cached_or_resolved(problem, arch)


def resolve_bwd_config(problem: Problem, arch: Arch):
    """The backward config (deterministic as ``problem`` asks) a backward of ``problem`` uses."""
    if problem.pass_ != "bwd":
        raise ValueError(f"resolve_bwd_config needs a bwd problem, got pass {problem.pass_!r}")
    return _cached_or_resolved(problem, arch)


def resolve_decode_config(problem: DecodeProblem, arch: Arch):
    """The decode config a launch of ``problem`` on ``arch`` uses (no explicit config given):
    fa4.decode asks once per plan, so a decode step pays nothing for it after its first call."""
    if not isinstance(problem, DecodeProblem):
        raise ValueError(f"resolve_decode_config needs a DecodeProblem, got {type(problem).__name__}")
    return _cached_or_resolved(problem, arch)


def explain_problem(problem: Problem | DecodeProblem, arch: Arch | None = None, *, device: str | None = None,
                    config=None, timing: str | Timing | None = None) -> Resolution:
    """Which config a launch of ``problem`` would use and the chain of sources asked for it.

    ``timing``: the mode to explain (fa4.timing); default: the one a launch made here now asks for."""
    arch = arch or SM90
    timing = launch_timing() if timing is None else Timing.parse(timing).name
    if config is not None:
        cfg = _explicit(problem, arch, config)
        return Resolution(cfg, "explicit", (Step("explicit", "used", "config= passed by the caller"),),
                          timing=timing)
    hit = _state.cache.get((problem, arch, timing))
    if hit is not None and (hit.expires == math.inf or hit.expires > time.monotonic()) and device is None:
        _, timing_error = _configured_timing()
        return Resolution(hit.config, hit.provenance,
                          (Step("cache", "used", f"resolved earlier in this process from {hit.provenance}"),)
                          + ((Step("timing", "error", timing_error),)
                             if timing_error and Step("timing", "error", timing_error) not in hit.steps else ())
                          + hit.steps,
                          hit.tflops, hit.measured_problem, hit.expires, timing)
    # A device named by the caller may not be the one launches run on: do not cache its answer.
    return _resolve(problem, arch, device, timing, remember=device is None)


def _explicit(problem: Problem, arch: Arch, config):
    from fa4.knobs import as_config

    return as_config(entry_for(problem, arch).config_cls, config)


def resolve_config(problem: Problem, arch: Arch, config=None):
    """(dispatch entry, config) a launch of ``problem`` uses: the explicit ``config`` (object or
    dict of its knobs) or the chain's answer, checked for feasibility (ValueError if not)."""
    from fa4.knobs import as_config

    entry = entry_for(problem, arch)
    name = "config" if problem.pass_ == "fwd" else "bwd_config"
    if config is None:
        config = (resolve_fwd_config if problem.pass_ == "fwd" else resolve_bwd_config)(problem, arch)
    config = as_config(entry.config_cls, config, name)
    bad = entry.violations(config, problem, arch)
    if bad:
        raise ValueError(f"infeasible {name}: " + "; ".join(bad))
    return entry, config


# -- the chain ------------------------------------------------------------------------------


def _resolve(problem: Problem, arch: Arch, device: str | None, timing: str = DEFAULT_TIMING,
             remember: bool = True) -> Resolution:
    key = (problem, arch, timing)
    steps: list[Step] = [Step("cache", "miss")]
    _, timing_error = _configured_timing()
    if timing_error:
        steps.append(Step("timing", "error", timing_error))
    # No kernel for this arch and pass at all (NotImplementedError): the launch must fail, with that message.
    entry = entry_for(problem, arch)
    expires = math.inf
    found: tuple | None = None

    if device is None:
        device, why = _device_name()
        if device is None:
            steps.append(Step("local-db", "skipped", why))
            steps.append(Step("service", "skipped", why))
    if device is not None:
        fp = _fingerprint()
        found = _from_sources(problem, arch, entry, device, fp, timing, steps)
        if found is None:
            found, expires = _from_service(problem, arch, entry, device, fp, timing, steps)

    if found is not None:
        config, source, tflops, measured = found
        res = Resolution(config, source, tuple(steps), tflops, measured, expires, timing)
    else:
        try:
            config = entry.default_config(problem, arch)
        except Exception as e:
            raise ValueError(f"no default config for {problem.key()} on {arch.name}: {e}") from e
        steps.append(Step("default", "used", "heuristic default of the kernel's knob declaration"))
        res = Resolution(config, "default", tuple(steps), expires=expires, timing=timing)
    if remember:
        with _state.lock:
            _state.cache[key] = res
    return res


def _device_name() -> tuple[str | None, str]:
    name = os.environ.get(DEVICE_ENV, "").strip()
    if name:
        return name, ""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(torch.cuda.current_device()), ""
    except Exception as e:
        return None, f"cannot name the CUDA device: {type(e).__name__}: {e}"
    return None, f"no CUDA device to look results up for (set {DEVICE_ENV} to name one)"


def _fingerprint() -> str | None:
    """Source fingerprint of the running kernel code, as the tuner records it."""
    st = _state
    if not st.fingerprint_done:
        try:
            from fa4.fingerprint import source_fingerprint

            st.fingerprint = source_fingerprint()
        except Exception as e:
            st.fingerprint_error = f"{type(e).__name__}: {e}"
        st.fingerprint_done = True
    return st.fingerprint


def _usable(entry, problem: Problem, arch: Arch, data: Any) -> tuple[Any, str | None]:
    from fa4.knobs import config_from_dict

    try:
        cfg = config_from_dict(entry.config_cls, data or {})
    except Exception as e:
        return None, f"config rejected by {entry.config_cls.__name__}: {e}"
    try:
        bad = entry.violations(cfg, problem, arch)
    except Exception as e:
        bad = [f"{type(e).__name__}: {e}"]
    if bad:
        return None, "config infeasible here: " + "; ".join(bad)
    return cfg, None


def _sources() -> list:
    """The config sources installed beside the kernels (entry point group SOURCES_GROUP), then
    the registered ones; loaded once per lookup state."""
    st = _state
    if st.sources is None:
        found, errors = [], []
        try:
            from importlib.metadata import entry_points

            eps = sorted(entry_points(group=SOURCES_GROUP), key=lambda ep: ep.name)
        except Exception as e:
            eps, errors = [], [f"cannot list {SOURCES_GROUP} entry points: {type(e).__name__}: {e}"]
        for ep in eps:
            try:
                found.append(ep.load()())
            except Exception as e:
                errors.append(f"config source {ep.name!r} ({ep.value}) failed to load: {type(e).__name__}: {e}")
        st.sources, st.source_errors = found + list(_registered), errors
    return st.sources


def register_source(source) -> None:
    """Add a config source (an object with ``name``, ``answer(problem, device, fingerprint, timing)``
    and ``close()``; ``timing`` is the canonical mode of fa4.timing it must answer for, from its
    measurements of that mode only) after the installed ones; it is asked from the next reset() on."""
    _registered.append(source)


def local_sources_enabled() -> bool:
    """Whether launches may ask the local config sources ($FA4_LOOKUP_LOCAL_DB=0 turns them off,
    for configs and for provider="auto"'s choice alike)."""
    return os.environ.get(LOCAL_DB_ENV, "1").strip() != "0"


def _from_sources(problem, arch, entry, device, fp, timing, steps) -> tuple | None:
    if not local_sources_enabled():
        steps.append(Step("local-db", "skipped", f"disabled by {LOCAL_DB_ENV}=0"))
        return None
    sources = _sources()
    if not sources:
        why = "; ".join(_state.source_errors) or (
            f"no results store is installed (no {SOURCES_GROUP} entry point; fa4-tune's store provides one)")
        steps.append(Step("local-db", "skipped", why))
        return None
    for src in sources:
        if fp is None:
            steps.append(Step(src.name, "skipped",
                              f"the running kernel's source fingerprint is unknown ({_state.fingerprint_error})"))
            continue
        try:
            ans = src.answer(problem, device, fp, timing)
        except Exception as e:
            steps.append(Step(src.name, "error", f"{type(e).__name__}: {e}"))
            continue
        if ans.outcome != "used":
            steps.append(Step(src.name, ans.outcome, ans.detail))
            continue
        cfg, why = _usable(entry, problem, arch, ans.config)
        if cfg is None:
            steps.append(Step(src.name, "error", f"{ans.ref}: {why}"))
            continue
        steps.append(Step(src.name, "used", ans.detail))
        return cfg, src.name, ans.tflops, ans.measured_problem
    return None


def _from_service(problem, arch, entry, device, fp, timing, steps) -> tuple[tuple | None, float]:
    """(answer or None, expiry of the resulting cache entry)."""
    base = os.environ.get(URL_ENV, "").strip()
    if not base:
        steps.append(Step("service", "skipped", f"{URL_ENV} is not set"))
        return None, math.inf
    st = _state
    now = time.monotonic()
    if st.service_down_until > now:
        steps.append(Step("service", "skipped",
                          f"failed {SERVICE_RETRY_S - (st.service_down_until - now):.0f} s ago "
                          f"({st.service_down_reason}); retried after {SERVICE_RETRY_S:.0f} s"))
        # This class never reached the service: ask again once the pause is over.
        return None, st.service_down_until
    key = (problem, arch, device, timing)
    with st.lock:
        if key in st.asked:
            steps.append(Step("service", "skipped", "already asked once for this problem in this process"))
            return None, math.inf
        st.asked.add(key)
    if isinstance(problem, DecodeProblem):
        # The decode endpoint's parameters are the DecodeProblem's fields (its "kind" is the path).
        fields, provider, path = dataclasses.asdict(problem), DECODE_PROVIDER, "/v1/configs/best-decode"
    else:
        fields, provider, path = problem.to_dict(), PROVIDER, "/v1/configs/best"
    params = {**fields, "device": device, "provider": provider, "arch": arch.name, "timing": timing}
    if fp is not None:
        params["source_fingerprint"] = fp
    url = base.rstrip("/") + path
    timeout = _http_timeout(steps)
    try:
        import httpx

        r = httpx.get(url, params=params, timeout=timeout)
    except Exception as e:
        return _service_failed(steps, f"{type(e).__name__}: {e}")
    if r.status_code >= 500:
        return _service_failed(steps, f"HTTP {r.status_code}")
    try:
        body = r.json()
    except Exception:
        return _service_failed(steps, f"HTTP {r.status_code} with a body that is not JSON")
    if r.status_code != 200 or not isinstance(body, dict):
        msg = body.get("error") if isinstance(body, dict) else None
        steps.append(Step("service", "error", f"HTTP {r.status_code}: {msg or 'unexpected answer'}"))
        return None, math.inf
    prov = body.get("provenance")
    if prov not in ("exact", "nearest"):
        steps.append(Step("service", "miss", f"the service has no {timing} measurement ({prov})"))
        return None, math.inf
    cfg, why = _usable(entry, problem, arch, body.get("config"))
    if cfg is None:
        steps.append(Step("service", "error", why or ""))
        return None, math.inf
    stale = " (stale source)" if body.get("stale") else ""
    tflops = body.get("tflops")
    steps.append(Step("service", "used",
                      f"{prov}{stale} {timing} answer of {base}, measurement {body.get('measurement_id')}"))
    return (cfg, f"service:{prov}", tflops if isinstance(tflops, (int, float)) else None,
            body.get("measured_problem")), math.inf


def _http_timeout(steps) -> float:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return HTTP_TIMEOUT_S
    try:
        t = float(raw)
    except ValueError:
        t = math.nan
    if not (math.isfinite(t) and t > 0):
        steps.append(Step("service", "error", f"{TIMEOUT_ENV}={raw!r} is not a positive number of seconds; "
                                              f"using {HTTP_TIMEOUT_S} s"))
        return HTTP_TIMEOUT_S
    return t


def _service_failed(steps, reason: str) -> tuple[None, float]:
    st = _state
    st.service_down_until = time.monotonic() + SERVICE_RETRY_S
    st.service_down_reason = reason
    steps.append(Step("service", "error", f"{reason}; not asked again for {SERVICE_RETRY_S:.0f} s"))
    return None, math.inf
