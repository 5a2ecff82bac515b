"""What an attention implementation must offer to be tuned and benchmarked."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

from fa4.arch import Arch
from fa4.fingerprint import files_fingerprint
from fa4.knobs import config_from_dict, config_to_dict, iter_configs
from fa4.problem import Problem


class ProviderError(ValueError):
    """The provider cannot handle the request at all (bad problem for it): a user error."""


class Provider:
    """Base class. Subclasses set ``name``, ``passes`` and ``knob_cls`` and override the callables.

    A provider whose ``knob_cls`` is None has nothing to tune; the tuner then measures its
    one configuration (config ``None``).
    """

    name: str = ""
    passes: tuple[str, ...] = ("fwd", "bwd")
    # Whether it runs issue 18's window / softcap / sink problems (harness.feature_kwargs).
    features: bool = False
    # Whether it runs packed varlen problems (the harness's varlen_args: cu_seqlens of the
    # problem's varlen_seqlens(), q/k/v packed by make_inputs).
    varlen: bool = False
    knob_cls: type | None = None
    # False only for providers that do not touch a GPU (the replay provider serves recorded
    # numbers), so the tuner can run its full logic on a CPU machine with them.
    needs_gpu: bool = True

    # ---- capability ------------------------------------------------------------------
    def available(self) -> str | None:
        """None when usable here, else why not, in words."""
        return None

    def warmup(self) -> None:
        """Load what the first measurement would otherwise load on its own clock: modules
        (torch, the CuTe DSL, the implementation) and the CUDA context. Run by the isolated
        measuring process as soon as it starts, while its parent is still opening studies."""
        if self.available() is None and self.needs_gpu:
            import torch

            torch.cuda.init()
            torch.empty(1, device="cuda")

    def knob_cls_for(self, problem: Problem) -> type | None:
        """The knob dataclass that applies to this problem (a provider may differ per pass)."""
        return self.knob_cls

    def problem_errors(self, problem: Problem) -> list[str]:
        """Reasons this provider cannot run the problem under any config (user errors)."""
        if problem.pass_ not in self.passes:
            return [f"{self.name} does not implement the {problem.pass_} pass"]
        if problem.features() and not self.features:
            return [f"{self.name} does not take {', '.join(problem.features())} (issue 18's features)"]
        if problem.varlen and not self.varlen:
            # A dense harness would time B padded sequences of the longest length: a wrong number.
            return [f"{self.name} does not measure packed variable-length (varlen) problems"]
        if problem.varlen:
            try:
                problem.varlen_seqlens()
            except ValueError as e:  # the lengths a measurement packs cannot be made
                return [f"varlen: {e}"]
        return []

    def violations(self, config, problem: Problem, arch: Arch) -> list[str]:
        """Empty when the config is feasible for the problem on the arch, else human reasons."""
        return []

    def default_config(self, problem: Problem, arch: Arch):
        """The config the implementation picks by itself (its heuristic)."""
        cls = self.knob_cls_for(problem)
        return cls() if cls is not None else None

    def feasible_configs(self, problem: Problem, arch: Arch) -> list:
        cls = self.knob_cls_for(problem)
        if cls is None:
            return [None]
        return [c for c in iter_configs(cls, problem) if not self.violations(c, problem, arch)]

    # ---- config plumbing -------------------------------------------------------------
    def config_from_dict(self, problem: Problem, data: dict | None):
        """The config object of ``data``. ``None`` stays ``None``: "no config given", which every
        provider's make_fwd/make_fwd_bwd resolves to the config a user would get (for fa4 the
        launch-time lookup chain), not the knob dataclass's field defaults (an empty dict)."""
        cls = self.knob_cls_for(problem)
        if cls is None:
            if data:
                raise ValueError(f"{self.name} has no knobs, got {sorted(data)}")
            return None
        if data is None:
            return None
        return config_from_dict(cls, data)

    @staticmethod
    def config_to_dict(config) -> dict | None:
        return None if config is None else config_to_dict(config)

    # ---- running ---------------------------------------------------------------------
    def make_fwd(self, problem: Problem, config, q, k, v) -> Callable[[], Any]:
        """A callable computing the forward output (batch, seqlen_q, heads_q, head_dim_v)."""
        raise NotImplementedError

    def make_fwd_bwd(self, problem: Problem, config, q, k, v, do) -> Callable[[], Any]:
        """A callable running the backward of one forward and returning (dq, dk, dv).

        The forward is run once when the callable is built (its graph kept), so timing the
        callable times the backward alone, which is what bwd FLOPs count.
        """
        raise NotImplementedError

    def supports_compile_only(self, problem: Problem) -> bool:
        return False

    def compile_available(self) -> str | None:
        """None when compile_only() can run here (it may not need a GPU), else why not."""
        return self.available()

    def compile_variant(self, problem: Problem, config):
        """Identity of the compiled kernel a config needs; configs differing only in runtime knobs share one."""
        return (problem.key(), None if config is None else tuple(config_to_dict(config).items()))

    def compile_only(self, problem: Problem, config, arch: Arch) -> str | None:
        """Compile for ``arch`` without a GPU when the provider can; None = ok or not applicable."""
        return None

    def measure(self, problem: Problem, config, settings):
        """Measure one config; the harness does it for real providers (replay overrides)."""
        from . import harness

        return harness.measure(self, problem, config, settings)

    # ---- identity --------------------------------------------------------------------
    def source_files(self) -> list[Path]:
        """Files whose content defines the kernel code being measured."""
        return [Path(inspect.getfile(type(self)))]

    def source_fingerprint(self) -> str:
        return files_fingerprint(self.source_files())

    def versions(self) -> dict:
        return {}

    def describe(self, config) -> str:
        """Short human label of a config for tables."""
        if config is None:
            return "(no knobs)"
        return ", ".join(f"{k}={v}" for k, v in config_to_dict(config).items())
