"""Our own kernels (package fa4) as a tunable provider."""

from __future__ import annotations

from pathlib import Path

from fa4.arch import Arch
from fa4.knobs import Violation
from fa4.problem import Problem

from .base import Provider


def sm90_compile_unavailable() -> str | None:
    """Why our sm90 kernels cannot be compiled here, or None: the CuTe DSL compiles for sm_90a on
    any machine (fake tensors, CUTE_DSL_ARCH), so only its import can fail."""
    from fa4.sm90.compile import ensure_target

    ensure_target()
    try:
        import cutlass  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"CuTe DSL not importable: {e}"
    return None


def sm90_unavailable(what: str) -> str | None:
    """Why our sm90 kernels (``what``: "fa4 kernels are", ...) cannot run here, or None."""
    try:
        import cutlass  # noqa: F401
        import torch
    except Exception as e:  # noqa: BLE001
        return f"CuTe DSL / torch not importable: {e}"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (torch.cuda.is_available() is False); compile-only works without one"
    major, _ = torch.cuda.get_device_capability()
    if major != 9:
        return f"{what} built for sm90 only (this GPU is sm{major}x)"
    return None


class Fa4Provider(Provider):
    """Both passes: the forward (FwdConfigSm90) and the backward (BwdConfigSm90, timed alone
    after one forward, deterministic as the problem asks). The knob class, feasibility,
    default and compiled-kernel identity all follow the problem's pass. Varlen problems run
    through fa4.flash_attn_varlen_func on the harness's packed inputs (the varlen kernels)."""

    name = "fa4"
    passes = ("fwd", "bwd")
    features = True
    varlen = True

    @property
    def knob_cls(self):
        # What callers that do not name a pass get; everything pass-aware uses knob_cls_for.
        from fa4.sm90.fwd_config import FwdConfigSm90

        return FwdConfigSm90

    def knob_cls_for(self, problem: Problem):
        return self._knobs(problem)[0]

    @staticmethod
    def _knobs(problem: Problem):
        """(knob class, its config module) of the problem's pass (fa4.rules: no launch code)."""
        from fa4 import rules

        return rules.knob_cls(problem), rules.config_module(problem)

    def available(self) -> str | None:
        return sm90_unavailable("fa4 kernels are")

    def problem_errors(self, problem: Problem) -> list[str]:
        from fa4.sm90.fwd_config import head_dims_v

        e = super().problem_errors(problem)
        if problem.pass_ == "bwd":
            from fa4.sm90.bwd_config import HEAD_DIMS, HEAD_DIMS_V

            dvs = HEAD_DIMS_V.get(problem.head_dim, (problem.head_dim,))
        else:
            from fa4.sm90.fwd_config import HEAD_DIMS

            dvs = head_dims_v(problem.head_dim)
        if problem.head_dim not in HEAD_DIMS:
            e.append(f"head_dim {problem.head_dim} not supported by fa4's {problem.pass_} (supported: {HEAD_DIMS})")
        elif problem.head_dim_v not in dvs:
            e.append(f"fa4's {problem.pass_} needs head_dim_v in {dvs} at head_dim {problem.head_dim}")
        return e

    def violations(self, config, problem: Problem, arch: Arch) -> list[str]:
        errs = self.problem_errors(problem)
        if errs:
            return [Violation("problem", e) for e in errs]
        cls, m = self._knobs(problem)
        if not isinstance(config, cls):
            return [f"a {problem.pass_} config of fa4 is a {cls.__name__}, got {type(config).__name__}"]
        return m.violations(config, problem, arch)

    def default_config(self, problem: Problem, arch: Arch):
        from fa4 import rules

        return rules.defaults_module(problem).default_config(problem, arch)

    # Every call names provider="fa4": flash_attn_func's default, "auto", may run a peer the DB
    # measured faster, and this provider's rows must be our kernels' own.
    def make_fwd(self, problem: Problem, config, q, k, v):
        import fa4

        from providers.harness import feature_kwargs, varlen_args

        feat = feature_kwargs(problem, q.device)
        if problem.varlen:
            packed = varlen_args(problem, q.device)

            def run():
                return fa4.flash_attn_varlen_func(q, k, v, causal=problem.causal, config=config, **packed, **feat)

            return run

        def run():
            return fa4.flash_attn_func(q, k, v, provider="fa4", causal=problem.causal, config=config, **feat)

        return run

    def make_fwd_bwd(self, problem: Problem, config, q, k, v, do):
        # Timed as users run it (and as the peers are): autograd through fa4.flash_attn_func,
        # the backward config passed explicitly so the measurement is of exactly this config.
        import torch

        import fa4

        q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        from providers.harness import feature_kwargs, varlen_args

        kw = dict(causal=problem.causal, deterministic=problem.deterministic, bwd_config=config,
                  **feature_kwargs(problem, q.device))
        if problem.varlen:
            out = fa4.flash_attn_varlen_func(q, k, v, **varlen_args(problem, q.device), **kw)
        else:
            out = fa4.flash_attn_func(q, k, v, provider="fa4", **kw)

        def run():
            return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

        return run

    def supports_compile_only(self, problem: Problem) -> bool:
        return not self.problem_errors(problem)

    def compile_available(self) -> str | None:
        return sm90_compile_unavailable()

    def compile_variant(self, problem: Problem, config):
        gqa = problem.heads_q != problem.heads_kv
        if problem.pass_ == "bwd":
            from fa4.sm90.bwd_compile import compile_key
            from fa4.sm90.bwd_launch import window_flags

            # Issue 18's Problem fields where the Problem has them (the launch's own flags).
            causal, has_wl, has_wr, _, _ = window_flags(problem.causal, getattr(problem, "window_left", -1),
                                                        getattr(problem, "window_right", -1), problem.seqlen_q,
                                                        problem.seqlen_k)
            return compile_key(problem.dtype, problem.head_dim, causal, gqa, problem.deterministic, config,
                               problem.head_dim_v, has_wl, has_wr, getattr(problem, "softcap", 0.0) > 0,
                               bool(getattr(problem, "sink", False)), varlen=problem.varlen)
        from fa4.sm90.compile import compile_key

        # The varlen launch's key (fa4.varlen._plan): the forward measured alone returns no LSE.
        return compile_key(problem.dtype, problem.head_dim, problem.causal, False, config, problem.head_dim_v,
                           **problem.kernel_flags(), varlen=problem.varlen)

    def compile_only(self, problem: Problem, config, arch: Arch) -> str | None:
        """Compile the kernel ``config`` selects for ``arch`` (no GPU needed). For the backward
        that is the main kernel, the one the knobs shape; fa4.sm90.bwd_launch compiles the
        small pre/postprocess kernels at the first backward."""
        try:
            key = self.compile_variant(problem, config)
            if problem.pass_ == "bwd":
                from fa4.sm90.bwd_compile import compile_bwd_main

                compile_bwd_main(key)
            else:
                from fa4.sm90.compile import compile_fwd

                compile_fwd(key)
        except Exception as e:  # noqa: BLE001 - a compile failure is a result, not a crash
            return f"{type(e).__name__}: {str(e)[:500]}"
        return None

    def source_files(self) -> list[Path]:
        from fa4.fingerprint import kernel_source_files

        return kernel_source_files()

    def versions(self) -> dict:
        d = {}
        try:
            import importlib.metadata as md

            d["nvidia-cutlass-dsl"] = md.version("nvidia-cutlass-dsl")
        except Exception:  # noqa: BLE001
            pass
        try:
            import fa4

            d["fa4"] = fa4.__version__
        except Exception:  # noqa: BLE001
            pass
        return d
