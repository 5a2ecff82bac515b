"""PyTorch SDPA backends as untunable baselines: cuDNN attention and FlashAttention-2."""

from __future__ import annotations

from fa4.arch import Arch
from fa4.auto import SDPA_BACKENDS
from fa4.problem import Problem

from .base import Provider


class SdpaProvider(Provider):
    knob_cls = None
    backend_attr = ""  # name in torch.nn.attention.SDPBackend
    max_head_dim = 256

    def available(self) -> str | None:
        try:
            import torch
            from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
        except Exception as e:
            return f"torch SDPA is not importable: {e}"
        if not torch.cuda.is_available():
            return "needs a CUDA GPU (torch.cuda.is_available() is False)"
        return None

    def problem_errors(self, problem: Problem) -> list[str]:
        e = super().problem_errors(problem)
        if problem.head_dim != problem.head_dim_v:
            e.append(f"{self.name} via SDPA needs head_dim == head_dim_v")
        if problem.head_dim % 8 != 0 or problem.head_dim > self.max_head_dim:
            e.append(
                f"head_dim={problem.head_dim}: {self.name} supports multiples of 8 up to "
                f"{self.max_head_dim}"
            )
        if problem.deterministic and problem.pass_ == "bwd":
            e.append(f"{self.name} has no deterministic backward mode")
        return e

    def violations(self, config, problem: Problem, arch: Arch) -> list[str]:
        return self.problem_errors(problem)

    def _call(self, problem: Problem, q, k, v):
        # The same SDPA call fa4's dispatch makes for this peer (fa4.auto.run_peer): transposed
        # views of our (batch, seqlen, heads, dim) layout, this backend only, GQA without copies.
        from fa4.auto import run_peer

        return run_peer(self.name, q, k, v, None, problem.causal, False, False)

    def make_fwd(self, problem: Problem, config, q, k, v):
        def run():
            return self._call(problem, q, k, v)

        return run

    def make_fwd_bwd(self, problem: Problem, config, q, k, v, do):
        import torch

        q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        out = self._call(problem, q, k, v)

        def run():
            return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

        return run

    def versions(self) -> dict:
        import torch

        d = {"torch": torch.__version__}
        if self.backend_attr == "CUDNN_ATTENTION":
            try:
                d["cudnn"] = str(torch.backends.cudnn.version())
            except Exception:
                pass
        return d


class CudnnProvider(SdpaProvider):
    name = "cudnn"
    backend_attr = SDPA_BACKENDS[name]


class Fa2Provider(SdpaProvider):
    name = "fa2"
    backend_attr = SDPA_BACKENDS[name]
