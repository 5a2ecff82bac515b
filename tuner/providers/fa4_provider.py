"""Our own kernels (package fa4) as a tunable provider."""

from __future__ import annotations

from pathlib import Path

from fa4.arch import Arch
from fa4.problem import Problem

from .base import Provider


class Fa4Provider(Provider):
    name = "fa4"
    passes = ("fwd",)  # the backward arrives with its own issue

    @property
    def knob_cls(self):
        from fa4.sm90.fwd_config import FwdConfigSm90

        return FwdConfigSm90

    def available(self) -> str | None:
        try:
            import cutlass  # noqa: F401
            import torch
        except Exception as e:  # noqa: BLE001
            return f"CuTe DSL / torch not importable: {e}"
        if not torch.cuda.is_available():
            return "needs a CUDA GPU (torch.cuda.is_available() is False); compile-only works without one"
        major, _ = torch.cuda.get_device_capability()
        if major != 9:
            return f"fa4 kernels are built for sm90 only (this GPU is sm{major}x)"
        return None

    def problem_errors(self, problem: Problem) -> list[str]:
        from fa4.sm90.fwd_config import HEAD_DIMS

        e = super().problem_errors(problem)
        if problem.head_dim not in HEAD_DIMS:
            e.append(f"head_dim {problem.head_dim} not supported by fa4 (supported: {HEAD_DIMS})")
        if problem.head_dim_v != problem.head_dim:
            e.append("fa4 needs head_dim_v == head_dim")
        return e

    def violations(self, config, problem: Problem, arch: Arch) -> list[str]:
        from fa4.sm90.fwd_config import violations

        return self.problem_errors(problem) or violations(config, problem, arch)

    def default_config(self, problem: Problem, arch: Arch):
        from fa4.sm90.fwd_config import default_config

        return default_config(problem, arch)

    def make_fwd(self, problem: Problem, config, q, k, v):
        import fa4

        def run():
            return fa4.flash_attn_func(q, k, v, causal=problem.causal, config=config)

        return run

    def supports_compile_only(self, problem: Problem) -> bool:
        return not self.problem_errors(problem)

    def compile_available(self) -> str | None:
        # CuTe DSL compiles for sm_90a on any machine (fake tensors, CUTE_DSL_ARCH).
        from fa4.sm90.compile import ensure_target

        ensure_target()
        try:
            import cutlass  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return f"CuTe DSL not importable: {e}"
        return None

    def compile_variant(self, problem: Problem, config):
        from fa4.sm90.compile import compile_key

        return compile_key(problem.dtype, problem.head_dim, problem.causal, False, config)

    def compile_only(self, problem: Problem, config, arch: Arch) -> str | None:
        from fa4.sm90.compile import compile_fwd, compile_key

        try:
            compile_fwd(compile_key(problem.dtype, problem.head_dim, problem.causal, False, config))
        except Exception as e:  # noqa: BLE001 - a compile failure is a result, not a crash
            return f"{type(e).__name__}: {str(e)[:500]}"
        return None

    def source_files(self) -> list[Path]:
        root = Path(__file__).resolve().parents[2] / "fa4"
        return sorted([*root.glob("sm90/*.py"), *root.glob("common/*.py")])

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
