"""Our decode kernel (fa4.flash_attn_with_kvcache over a paged KV cache) as a tunable provider.

The knob class is DecodeConfigSm90 (num_splits with 0 = the split heuristic, pack_gqa, tile_n,
kv_stages, page_load); the problem a fa4.decode_problem.DecodeProblem. A measurement is one
decode step on a fresh paged cache every sequence of which holds ``seqlen_k_mean`` (else
``seqlen_k``) keys, checked against an fp32 reference, timed as the harness times everything.
Decode is bound by HBM bandwidth, so its throughput is the K and V bytes read per second: the
``tflops`` field of its measurements (the one the study maximises and the store ranks by)
holds TB/s for this provider, and the FLOP rate is derived from it where wanted
(DecodeProblem.flops / DecodeProblem.kv_bytes).
"""

from __future__ import annotations

import math
from pathlib import Path

from fa4.arch import Arch
from fa4.decode_problem import DecodeProblem
from fa4.knobs import Violation

from .base import Provider
from .fa4_provider import sm90_compile_unavailable, sm90_unavailable

NAME = "fa4-decode"


def tb_per_s(problem: DecodeProblem, ms: float) -> float:
    """K+V bytes read per second, in TB/s (10^12 bytes)."""
    return problem.kv_bytes / (ms * 1e-3) / 1e12


def make_decode_inputs(problem: DecodeProblem, seed: int, device="cuda"):
    """(q, k_cache, v_cache, cache_seqlens, page_table or None): pages dealt to the sequences in a
    shuffled order (a cache that is not one contiguous run), each sequence at the full length."""
    import torch

    from .harness import torch_dtype

    g = torch.Generator(device=device).manual_seed(seed)
    dt = torch_dtype(problem.dtype)
    b, hkv, d = problem.batch, problem.heads_kv, problem.head_dim
    length = problem.seqlen_k_mean or problem.seqlen_k

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dt)

    q = randn(b, problem.seqlen_q, problem.heads_q, d)
    if problem.paged:
        per_seq = math.ceil(problem.seqlen_k / problem.page_size)
        k = randn(b * per_seq, problem.page_size, hkv, d)
        v = randn(b * per_seq, problem.page_size, hkv, d)
        table = torch.randperm(b * per_seq, generator=g, device=device).to(torch.int32).view(b, per_seq)
    else:
        k, v, table = randn(b, problem.seqlen_k, hkv, d), randn(b, problem.seqlen_k, hkv, d), None
    seqlens = torch.full((b,), length, device=device, dtype=torch.int32)
    return q, k, v, seqlens, table


def _gather(cache, table, b: int, n: int):
    """(n, Hkv, D): sequence b's first n keys (or values)."""
    if table is None:
        return cache[b, :n]
    pages = table[b, : math.ceil(n / cache.shape[1])].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:n]


def _reference(problem: DecodeProblem, q, k, v, n: int, upcast: bool):
    """Attention of q (Sq, G, D) over k/v (n, D) of one KV head, fp32 math or the inputs' dtype."""
    import torch

    dt = torch.float32 if upcast else q.dtype
    sq, g, d = q.shape
    qf = q.to(dt).reshape(sq * g, d)
    s = (qf @ k.to(dt).T) * (1.0 / math.sqrt(d))
    if problem.causal:  # bottom-right: token t sees keys j <= t + n - Sq
        t = torch.arange(sq, device=q.device).repeat_interleave(g)[:, None]
        j = torch.arange(n, device=q.device)[None, :]
        s = s.masked_fill(j > t + n - sq, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(dt)
    return (p @ v.to(dt)).reshape(sq, g, d)


def decode_errors(problem: DecodeProblem, out, q, k, v, table, settings) -> tuple[float, float]:
    """(max |out - fp32 ref|, max |same-dtype ref - fp32 ref|) over the checked sequences and KV heads."""
    if not bool(out.isfinite().all().item()):
        return math.nan, math.nan
    n = problem.seqlen_k_mean or problem.seqlen_k
    g = problem.group
    nb = min(problem.batch, settings.check_batches)
    err = ref_err = 0.0
    for b in range(problem.batch - nb, problem.batch):  # the last ones catch stride bugs
        kb, vb = _gather(k, table, b, n), _gather(v, table, b, n)
        for h in range(min(problem.heads_kv, settings.check_heads)):
            qs = q[b, :, h * g:(h + 1) * g]
            ref = _reference(problem, qs, kb[:, h], vb[:, h], n, upcast=True)
            low = _reference(problem, qs, kb[:, h], vb[:, h], n, upcast=False)
            err = max(err, (out[b, :, h * g:(h + 1) * g].float() - ref).abs().max().item())
            ref_err = max(ref_err, (low.float() - ref).abs().max().item())
    return err, ref_err


class Fa4DecodeProvider(Provider):
    """fa4's decode step; tuned per DecodeProblem (``fa4-tune --decode``). Its default is the
    kernel's own: DecodeConfigSm90's default_config with num_splits=0, the split heuristic, so
    a study's first trial is what tuning has to beat."""

    name = NAME
    passes = ("decode",)

    @property
    def knob_cls(self):
        from fa4.sm90.decode_config import DecodeConfigSm90

        return DecodeConfigSm90

    def knob_cls_for(self, problem):
        return self.knob_cls

    def available(self) -> str | None:
        return sm90_unavailable("fa4's decode kernel is")

    def problem_errors(self, problem) -> list[str]:
        if not isinstance(problem, DecodeProblem):
            return [f"{self.name} tunes decode problems (fa4-tune --decode), got a {type(problem).__name__}"]
        from fa4.sm90.decode_config import HEAD_DIMS

        if problem.head_dim not in HEAD_DIMS:
            return [f"head_dim {problem.head_dim} not supported by fa4's decode kernel (supported: {HEAD_DIMS})"]
        return []

    def violations(self, config, problem, arch: Arch) -> list[str]:
        errs = self.problem_errors(problem)
        if errs:
            return [Violation("problem", e) for e in errs]
        from fa4.sm90 import decode_config

        if not isinstance(config, decode_config.DecodeConfigSm90):
            return [f"a config of {self.name} is a DecodeConfigSm90, got {type(config).__name__}"]
        return decode_config.violations(config, problem, arch)

    def default_config(self, problem, arch: Arch):
        from fa4.sm90.decode_config import default_config

        return default_config(problem, arch)

    def make_decode(self, problem: DecodeProblem, config, q, k, v, seqlens, table):
        import fa4

        def run():
            return fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, page_table=table,
                                               causal=problem.causal, config=config)

        return run

    def measure(self, problem, config, settings):
        """Build, check and time one config on the current GPU; never raises (harness.measure's rules)."""
        import time

        import torch

        from . import harness
        from .harness import INCORRECT, OK, Measurement

        first_call, phases, t0 = True, {}, time.perf_counter()

        def phase(name):
            nonlocal t0
            now = time.perf_counter()
            phases[name] = round(now - t0, 3)
            t0 = now

        try:
            q, k, v, seqlens, table = make_decode_inputs(problem, settings.seed)
            fn = self.make_decode(problem, config, q, k, v, seqlens, table)
            out = fn()
            torch.cuda.synchronize()
            first_call = False
            phase("build")
            err = ref_err = None
            if settings.check:
                err, ref_err = decode_errors(problem, out, q, k, v, table, settings)
                phase("check")
                if not harness.passes_error_rule(err, ref_err, settings.atol):
                    return Measurement(INCORRECT, reason=f"max abs error {err:.3g} > 2 x PyTorch's {ref_err:.3g} + "
                                       f"{settings.atol:g}", error=err, ref_error=ref_err, phases=phases)
            del out
            samples = harness.time_callable(fn, settings)
            phase("time")
        except harness.NotCapturable as e:
            return Measurement(harness.RUNTIME_ERROR, reason=str(e)[:300], phases=phases)
        except Exception as e:  # noqa: BLE001 - every failure is a result, never a crash of the study
            return Measurement(harness.classify_exception(e, first_call), reason=harness.short_reason(e),
                               phases=phases)
        med, iqr = harness.sample_stats(samples)
        return Measurement(OK, samples_ms=samples, median_ms=med, iqr_ms=iqr, tflops=tb_per_s(problem, med),
                           error=err, ref_error=ref_err, phases=phases)

    def supports_compile_only(self, problem) -> bool:
        return not self.problem_errors(problem)

    def compile_available(self) -> str | None:
        return sm90_compile_unavailable()

    def compile_variant(self, problem, config):
        """The decode kernel a config needs at this problem; runtime knobs (num_splits, pack_gqa) are
        normalised away, except whether it splits at all (the unsplit kernel writes O itself)."""
        from fa4.sm90.decode_compile import compile_key

        split = config.num_splits != 1  # 0 (auto) splits at the small batches tuning is for
        return compile_key(problem.dtype, problem.head_dim, problem.causal, problem.paged, True, split, False, config)

    def compile_only(self, problem, config, arch: Arch) -> str | None:
        try:
            from fa4.sm90.decode_compile import compile_decode

            compile_decode(self.compile_variant(problem, config))
        except Exception as e:  # noqa: BLE001 - a compile failure is a result, not a crash
            return f"{type(e).__name__}: {str(e)[:500]}"
        return None

    def source_files(self) -> list[Path]:
        from fa4.fingerprint import kernel_source_files

        return kernel_source_files()

    def versions(self) -> dict:
        from .fa4_provider import Fa4Provider

        return Fa4Provider().versions()
