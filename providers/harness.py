"""Benchmark harness shared by the tuner and the benchmark scripts.

One measurement = fresh random inputs, a correctness gate against an fp32 reference, then
timing with warm clocks in the settings' timing mode (fa4.timing): eager launches or replays of a
CUDA graph, with the L2 flushed between repetitions (cold) or not (warm). The pure helpers (statistics,
the error rule, exception classification) have no GPU dependency and are unit-tested on CPU.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from fa4.problem import Problem
from fa4.problem import varlen_lengths as varlen_lengths  # the packed lengths (one definition, in fa4)
from fa4.timing import DEFAULT_TIMING, Timing

OK = "ok"
INFEASIBLE = "infeasible"
COMPILE_ERROR = "compile_error"
RUNTIME_ERROR = "runtime_error"
INCORRECT = "incorrect"
STATUSES = (OK, INFEASIBLE, COMPILE_ERROR, RUNTIME_ERROR, INCORRECT)


@dataclass
class Settings:
    """How hard to measure. The defaults aim at ~0.3 s of timed work per candidate."""

    target_ms: float = 300.0  # total timed work per candidate; reps derive from it
    min_reps: int = 10
    max_reps: int = 200
    warmup_ms: float = 150.0  # run the kernel this long first so clocks settle at their boost
    # The timing mode (fa4.timing): "eager-cold" (the default), "graph-cold", "eager-warm", "graph-warm".
    timing: str = DEFAULT_TIMING
    check: bool = True
    check_batches: int = 1  # sub-sample of the batch compared against the fp32 reference
    check_heads: int = 2  # kv heads (with their query-head groups) compared
    atol: float = 1e-4
    seed: int = 0
    timeout_s: float = 600.0  # per candidate in the worker, compile included

    def __post_init__(self):
        self.timing = Timing.parse(self.timing).name  # ValueError for an unknown mode

    @property
    def mode(self) -> Timing:
        return Timing.parse(self.timing)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "Settings":
        return cls(**(d or {}))


@dataclass
class Measurement:
    status: str
    reason: str | None = None
    samples_ms: list[float] = field(default_factory=list)
    median_ms: float | None = None
    iqr_ms: float | None = None
    tflops: float | None = None
    error: float | None = None
    ref_error: float | None = None
    # Seconds per phase of this measurement in the measuring process: 'build' (compile and
    # first run), 'check' (against the reference), 'time'. Where a tuning run's time goes.
    phases: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        return cls(**d)


# ---- pure helpers ----------------------------------------------------------------------


def sample_stats(samples: Sequence[float]) -> tuple[float, float]:
    """(median, interquartile range) of timing samples."""
    if not samples:
        raise ValueError("no samples")
    xs = sorted(float(x) for x in samples)

    def q(p: float) -> float:  # linear interpolation between order statistics
        pos = p * (len(xs) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return q(0.5), q(0.75) - q(0.25)


def tflops(problem: Problem, ms: float) -> float:
    return problem.flops / (ms * 1e-3) / 1e12


def passes_error_rule(error: float, ref_error: float, atol: float) -> bool:
    """The FlashAttention test rule: within 2x PyTorch's own same-dtype error plus atol.

    NaN never passes (a comparison with NaN is False, and an infinite error fails too).
    """
    if not (math.isfinite(error) and math.isfinite(ref_error)):
        return False
    return error <= 2.0 * ref_error + atol


def classify_exception(exc: BaseException, first_call: bool) -> str:
    """compile_error or runtime_error for an exception raised while building or running.

    CuTe DSL kernels compile on their first call, so an exception there that is not a CUDA
    error is a compile failure; a CUDA error (sticky, poisoning the context) is always a
    runtime error.
    """
    text = f"{type(exc).__name__} {exc}"
    cuda_error = type(exc).__name__ in ("AcceleratorError", "OutOfMemoryError") or "CUDA error" in text
    if cuda_error or not first_call:
        return RUNTIME_ERROR
    return COMPILE_ERROR


def short_reason(exc: BaseException, limit: int = 300) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    msg = lines[0] if lines else ""
    # DSL errors put the useful line last; keep both ends when they differ.
    if len(lines) > 1 and lines[-1] != msg:
        msg = f"{msg} ... {lines[-1]}"
    out = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    return out[:limit]


def reps_for(estimate_ms: float, settings: Settings) -> int:
    if estimate_ms <= 0:
        return settings.max_reps
    n = int(settings.target_ms / estimate_ms)
    return max(settings.min_reps, min(settings.max_reps, n))


def is_sticky_cuda_failure(m: Measurement) -> bool:
    """A failure after which the CUDA context cannot be trusted (the worker must restart)."""
    r = m.reason or ""
    return m.status == RUNTIME_ERROR and ("CUDA" in r or "AcceleratorError" in r or "illegal" in r)


# ---- GPU side --------------------------------------------------------------------------


def torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def make_inputs(problem: Problem, seed: int, device="cuda"):
    """Fresh standard-normal q, k, v (and dO for bwd), layout (batch, seqlen, heads, dim); for a
    varlen problem packed, (total, heads, dim), the sequences of varlen_args back to back."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    dt = torch_dtype(problem.dtype)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dt)

    if problem.varlen:
        lens_q, lens_k = problem.varlen_seqlens()
        rows_q, rows_k = (sum(lens_q),), (sum(lens_k),)
    else:
        rows_q, rows_k = (problem.batch, problem.seqlen_q), (problem.batch, problem.seqlen_k)
    q = randn(*rows_q, problem.heads_q, problem.head_dim)
    k = randn(*rows_k, problem.heads_kv, problem.head_dim)
    v = randn(*rows_k, problem.heads_kv, problem.head_dim_v)
    do = randn(*rows_q, problem.heads_q, problem.head_dim_v) if problem.pass_ == "bwd" else None
    return q, k, v, do


def varlen_args(problem: Problem, device="cuda") -> dict:
    """A varlen problem's packing as flash_attn_varlen_func's keyword arguments (ours and the
    reference FA4's: the same names): cu_seqlens_q/k of Problem.varlen_seqlens() on the device, and
    max_seqlen_q/k (host ints, the longest: the problem's seqlen_q/k)."""
    from fa4.varlen import cu_seqlens  # torch: imported where a measurement needs it

    lens_q, lens_k = problem.varlen_seqlens()
    return {"cu_seqlens_q": cu_seqlens(lens_q, device), "cu_seqlens_k": cu_seqlens(lens_k, device),
            "max_seqlen_q": max(lens_q), "max_seqlen_k": max(lens_k)}


def sink_for(problem: Problem, device="cuda"):
    """The learnable sink logits every measurement of ``problem`` uses, or None without sinks:
    fixed per problem (seeded by its head count), so each provider and the reference see the same."""
    if not problem.sink:
        return None
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(problem.heads_q)
    return torch.randn(problem.heads_q, generator=g, device=device, dtype=torch.float32)


def feature_kwargs(problem: Problem, device="cuda") -> dict:
    """The problem's window / softcap / sink as flash_attn_func's keyword arguments (ours and the
    reference FA4's: the same names)."""
    return {"window_size": (problem.window_left if problem.window_left >= 0 else None,
                            problem.window_right if problem.window_right >= 0 else None),
            "softcap": problem.softcap, "learnable_sink": sink_for(problem, device)}


def check_slices(problem: Problem, settings: Settings):
    """(batch indices, query-head indices, kv-head indices) compared against the reference.

    Varlen: the batch indices are sequences (the last are the longest, at the largest offsets).
    Whole query-head groups are kept with their kv head so GQA gradients of K and V are
    complete within the slice.
    """
    nb = min(problem.batch, settings.check_batches)
    batches = list(range(problem.batch - nb, problem.batch))  # the last ones catch stride bugs
    hkv = problem.heads_kv
    picks = sorted({0, hkv - 1} if settings.check_heads >= 2 else {0})[: max(1, settings.check_heads)]
    group = problem.heads_q // hkv
    qheads = [h * group + j for h in picks for j in range(group)]
    return batches, qheads, picks


def reference_attention(problem: Problem, q, k, v, upcast: bool, sink=None):
    """Attention on (b, s, h, d) tensors with k/v already expanded to q's heads.

    upcast=True: fp32 everywhere (the reference). upcast=False: PyTorch's own computation in
    the input dtype (matmuls in 16-bit, softmax in fp32 then rounded), whose error against
    the reference sets the tolerance. The problem's softcap, window and (``sink``: the logits of
    these heads) sinks as the reference FA4 defines them.
    """
    import torch

    scale = 1.0 / math.sqrt(problem.head_dim)
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (b, h, s, d)
    s = torch.matmul(qt, kt.transpose(-1, -2)).float() * scale
    if problem.softcap:
        s = problem.softcap * torch.tanh(s / problem.softcap)
    sq, sk = s.shape[-2], s.shape[-1]
    # Bottom-right aligned: query i sees keys i + o - left <= j <= i + o (+ right), o = sk - sq.
    i = torch.arange(sq, device=s.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=s.device)[None, :]
    if problem.causal:
        s = s.masked_fill(j > i, float("-inf"))
    if problem.window_right >= 0:
        s = s.masked_fill(j > i + problem.window_right, float("-inf"))
    if problem.window_left >= 0:
        s = s.masked_fill(j < i - problem.window_left, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.float().to(s.device)[None, :, None, None].expand(*s.shape[:3], 1)], dim=-1)
    # Rows that see no key (and no sink): zero output, as the kernels give.
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)[..., :sk]
    p = p.to(vt.dtype)
    o = torch.matmul(p, vt)
    return o.transpose(1, 2)


def _sequence(problem: Problem, t, b: int, side: str):
    """Sequence ``b`` of q-side (``side`` "q": q, out, dO, dQ) or k-side ("k") tensor ``t`` as a
    (1, seqlen, heads, dim) view: the dense batch entry, or the packed rows of the sequence."""
    if not problem.varlen:
        return t[b : b + 1]
    lens = problem.varlen_seqlens()[0 if side == "q" else 1]
    start = sum(lens[:b])
    return t[start : start + lens[b]].unsqueeze(0)


def _expand_kv(t, group: int):
    return t.repeat_interleave(group, dim=2) if group > 1 else t


def _all_finite(t) -> bool:
    # Checked on the whole output, not only the compared slice: NaN anywhere never passes.
    return bool(t.isfinite().all().item())


def _max_abs(a, b) -> float:
    d = (a.float() - b.float()).abs().max().item()
    return float(d)


def fwd_errors(problem: Problem, out, q, k, v, settings: Settings) -> tuple[float, float]:
    """(max |out - ref|, max |pytorch_same_dtype - ref|) on the checked slice, head by head."""
    if not _all_finite(out):
        return math.nan, math.nan
    batches, qheads, kvheads = check_slices(problem, settings)
    group = problem.heads_q // problem.heads_kv
    err = ref_err = 0.0
    for b in batches:
        # One sequence at a time: a packed one is its own attention problem (mask per sequence).
        qb, kb, vb, ob = (_sequence(problem, t, b, side) for t, side in ((q, "q"), (k, "k"), (v, "k"), (out, "q")))
        for kvh in kvheads:
            hs = list(range(kvh * group, (kvh + 1) * group))
            qs = qb[:, :, hs]
            ks = _expand_kv(kb[:, :, kvh : kvh + 1], group)
            vs = _expand_kv(vb[:, :, kvh : kvh + 1], group)
            sink = sink_for(problem, q.device)
            sink = sink[hs] if sink is not None else None
            ref = reference_attention(problem, qs, ks, vs, upcast=True, sink=sink)
            pt = reference_attention(problem, qs, ks, vs, upcast=False, sink=sink)
            err = max(err, _max_abs(ob[:, :, hs], ref))
            ref_err = max(ref_err, _max_abs(pt, ref))
    return err, ref_err


def bwd_errors(problem: Problem, grads, q, k, v, do, settings: Settings) -> tuple[float, float]:
    """Worst of dq, dk, dv: (max |grad - ref|, max |pytorch_same_dtype - ref|) on the slice."""
    import torch

    dq, dk, dv = grads
    if not all(_all_finite(g) for g in grads):
        return math.nan, math.nan
    batches, _, kvheads = check_slices(problem, settings)
    group = problem.heads_q // problem.heads_kv
    err = ref_err = 0.0
    for b in batches:
        qb, kb, vb, dob, dqb, dkb, dvb = (_sequence(problem, t, b, side) for t, side in (
            (q, "q"), (k, "k"), (v, "k"), (do, "q"), (dq, "q"), (dk, "k"), (dv, "k")))
        for kvh in kvheads:
            hs = list(range(kvh * group, (kvh + 1) * group))
            results = {}
            for upcast in (True, False):
                qs = qb[:, :, hs].detach().clone().requires_grad_(True)
                ks = kb[:, :, kvh : kvh + 1].detach().clone().requires_grad_(True)
                vs = vb[:, :, kvh : kvh + 1].detach().clone().requires_grad_(True)
                sink = sink_for(problem, q.device)
                o = reference_attention(problem, qs, _expand_kv(ks, group), _expand_kv(vs, group), upcast,
                                        sink=sink[hs] if sink is not None else None)
                dos = dob[:, :, hs]
                results[upcast] = torch.autograd.grad(o, (qs, ks, vs), dos.to(o.dtype))
            got = (dqb[:, :, hs], dkb[:, :, kvh : kvh + 1], dvb[:, :, kvh : kvh + 1])
            for g, r, p in zip(got, results[True], results[False]):
                err = max(err, _max_abs(g, r))
                ref_err = max(ref_err, _max_abs(p, r))
    return err, ref_err


def _device_props(device=None):
    import torch

    return torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())


def l2_flush_buffer(device=None):
    """A buffer twice the device's L2, written between reps so no rep starts with a warm L2."""
    import torch

    l2 = int(getattr(_device_props(device), "L2_cache_size", 0) or 64 * 2**20)
    return torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")


def clock_khz(device=None) -> int:
    """The GPU's clock in kHz (CUDA's clockRate; the H200's 1,980 MHz where torch does not say)."""
    return int(getattr(_device_props(device), "clock_rate", 0) or 1_980_000)


def host_cover_cycles(host_s: Sequence[float], clock_khz: int) -> int:
    """GPU clock cycles to sleep so a call's host path ends before the GPU wakes: twice the median
    of ``host_s`` (seconds; the first call, which may allocate or compile, left out) plus 20 us,
    at most 20 ms. ``torch.cuda._sleep`` counts clock cycles; a GPU clocked below ``clock_khz``
    only sleeps longer. A rep whose host path outlasts it anyway (a GC pause) is one slow sample,
    which the median over the reps absorbs."""
    s = sorted(host_s[1:] if len(host_s) > 1 else host_s)
    if not s:
        return 0
    median = s[len(s) // 2]
    return int(min(2.0 * median + 20e-6, 20e-3) * clock_khz * 1e3)


class NotCapturable(RuntimeError):
    """The callable cannot be captured into a CUDA graph (graph timing modes): a runtime_error
    result with this reason, never an eager timing in its place."""

    PREFIX = "not capturable under CUDA graphs: "


def capture_graph(fn: Callable[[], object]):
    """``fn`` captured into a ``torch.cuda.CUDAGraph``, the way PyTorch requires: a few warm-up
    calls on a side stream first (lazy initialisation, allocator pools, cuBLAS workspaces must not
    happen during capture), then the capture itself on that side stream."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            fn()
        torch.cuda.synchronize()
    except Exception as e:
        raise NotCapturable(NotCapturable.PREFIX + short_reason(e)) from e
    return graph


def time_callable(fn: Callable[[], object], settings: Settings) -> list[float]:
    """Per-rep milliseconds from CUDA events, clocks warmed first, in the settings' timing mode.

    eager: each rep calls ``fn``. graph: ``fn`` is captured once (after the warm-up) and each rep
    replays the graph; a callable that cannot be captured raises NotCapturable. cold: the L2 is
    flushed before each rep, outside the timed events; warm: nothing runs between reps.

    eager-cold times the GPU's work alone: after the flush the GPU sleeps for longer than ``fn``'s
    host path took in the warm-up, so the rep's kernels are all queued when its start event fires.
    Without it a rep's time held whatever host time the flush did not cover, so the same call
    measured differently with flushes of different lengths (SDPA's cuDNN forward at hd64 B16 S1k:
    0.109 ms here with a 2x-L2 flush, 0.085 ms under do_bench's 256 MB one). A host-bound call's
    cost is eager-warm's to show: back-to-back reps, nothing in between (fa4.auto charges the
    slower of the two).
    """
    import torch

    mode = settings.mode
    flush = l2_flush_buffer() if mode.flush_l2 else None
    # Warm-up: run until warmup_ms of wall time has passed so the GPU leaves its idle clocks.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    host_s = []  # each warm-up call's host time (its length: the number of warm-up calls)
    while True:
        h0 = time.perf_counter()
        fn()
        host_s.append(time.perf_counter() - h0)
        if len(host_s) % 4 == 0:
            torch.cuda.synchronize()
            if (time.perf_counter() - t0) * 1e3 >= settings.warmup_ms:
                break
    torch.cuda.synchronize()
    estimate = (time.perf_counter() - t0) * 1e3 / len(host_s)
    reps = reps_for(estimate, settings)
    run = capture_graph(fn).replay if mode.graph else fn
    if mode.graph:
        run()  # the first replay uploads the graph: not part of any rep
        torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    cover = host_cover_cycles(host_s, clock_khz()) if flush is not None and not mode.graph else 0
    for i in range(reps):
        if flush is not None:
            flush.zero_()
        if cover:
            torch.cuda._sleep(cover)
        starts[i].record()
        run()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def measure(provider, problem: Problem, config, settings: Settings) -> Measurement:
    """Build, check and time one config of a provider on the current GPU. Never raises."""
    import torch

    first_call = True
    phases: dict[str, float] = {}
    t0 = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal t0
        now = time.perf_counter()
        phases[name] = round(now - t0, 3)
        t0 = now

    try:
        q, k, v, do = make_inputs(problem, settings.seed)
        if problem.pass_ == "fwd":
            fn = provider.make_fwd(problem, config, q, k, v)
        else:
            fn = provider.make_fwd_bwd(problem, config, q, k, v, do)
        out = fn()
        torch.cuda.synchronize()
        first_call = False
        phase("build")
        if settings.check:
            if problem.pass_ == "fwd":
                err, ref_err = fwd_errors(problem, out, q, k, v, settings)
            else:
                err, ref_err = bwd_errors(problem, out, q, k, v, do, settings)
            phase("check")
            if not passes_error_rule(err, ref_err, settings.atol):
                return Measurement(
                    INCORRECT,
                    reason=f"max abs error {err:.3g} > 2 x PyTorch's {ref_err:.3g} + {settings.atol:g}",
                    error=err,
                    ref_error=ref_err,
                    phases=phases,
                )
        else:
            err = ref_err = None
        del out
        samples = time_callable(fn, settings)
        phase("time")
    except NotCapturable as e:  # graph modes: never an eager timing in its place
        return Measurement(RUNTIME_ERROR, reason=str(e)[:300], phases=phases)
    except Exception as e:  # every failure is a result, never a crash of the study
        return Measurement(classify_exception(e, first_call), reason=short_reason(e), phases=phases)
    med, iqr = sample_stats(samples)
    return Measurement(
        OK,
        samples_ms=samples,
        median_ms=med,
        iqr_ms=iqr,
        tflops=tflops(problem, med),
        error=err,
        ref_error=ref_err,
        phases=phases,
    )
