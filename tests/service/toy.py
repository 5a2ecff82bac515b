"""A CPU-only provider with a small knob class, registered by the service tests."""

from __future__ import annotations

from dataclasses import dataclass

from fa4.knobs import knob
from providers.base import Provider


@dataclass(frozen=True)
class ToyKnobs:
    tile_m: int = knob((64, 128, 192), 128, "rows of Q per CTA")
    tile_n: int = knob((64, 128), 128, "rows of K/V per inner step")
    overlap: bool = knob((False, True), True, "overlap softmax with the next GEMM")


class ToyProvider(Provider):
    name = "toy"
    passes = ("fwd",)
    knob_cls = ToyKnobs
    needs_gpu = False
    # Tests change this to simulate edited kernel source.
    fingerprint = "toysrc-1"

    def source_fingerprint(self) -> str:
        return type(self).fingerprint

    def problem_errors(self, problem):
        errs = super().problem_errors(problem)
        if problem.head_dim not in (64, 128):
            errs.append(f"head_dim {problem.head_dim} is not supported")
        return errs

    def violations(self, config, problem, arch):
        # Stands in for a shared-memory limit: big tiles do not fit the large head dim.
        if config.tile_m == 192 and problem.head_dim == 128:
            return ["tile_m 192 needs too much shared memory at head_dim 128"]
        return []

    def default_config(self, problem, arch):
        return ToyKnobs(tile_n=64)
