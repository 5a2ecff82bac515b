"""Fixtures shared by the GPU tests of tests/fa4: the fp32 references of bench/ as modules, loaded
once per process by tests.fa4.cpu_kernels."""

import pytest

from tests.fa4 import cpu_kernels


def _needs_cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.fixture(scope="module")
def check_bwd():
    """bench/check_bwd.py as a module (the backward's PyTorch-autograd reference and error rule)."""
    _needs_cuda()
    return cpu_kernels.check_bwd()


@pytest.fixture(scope="module")
def feat():
    """bench/check_bwd_feat.py as a module (the backward features' fp32 references and error rule)."""
    _needs_cuda()
    return cpu_kernels.check_bwd_feat()


class LaunchRecorder:
    """fa4.sm90.bwd_launch with its compiled kernels replaced by recorders (the GPU faked): each
    launch is kept as (name, key, args), name the compile key's first item ('main' for the main
    kernel's key); ``hooks[name](args)`` stands in for a kernel's writes where a test needs them."""

    def __init__(self, monkeypatch):
        import contextlib

        from fa4.sm90 import bwd_launch

        self.calls: list[tuple] = []
        self.hooks: dict = {}
        self._monkeypatch = monkeypatch
        self._module = bwd_launch
        monkeypatch.setattr(bwd_launch, "compiled", self._compiled)
        monkeypatch.setattr(bwd_launch, "_on_device", lambda t: contextlib.nullcontext())

    def _compiled(self, key, build):
        name = key[0] if isinstance(key, tuple) else "main"

        def launch(*args):
            self.calls.append((name, key, args))
            if name in self.hooks:
                self.hooks[name](args)
        return launch

    def names(self) -> list[str]:
        return [name for name, _, _ in self.calls]

    def args(self, name: str) -> list[tuple]:
        """The arguments of each launch of ``name``, in order."""
        return [args for n, _, args in self.calls if n == name]

    def keys(self, name: str) -> list:
        return [key for n, key, _ in self.calls if n == name]

    def fill_uninitialized(self, value: float) -> None:
        """The launch path's fp32 torch.empty buffers come filled with ``value``: a buffer the
        kernels are trusted to overwrite shows it, a zeroed one does not. Only the module's own
        name for torch is replaced."""
        import torch

        class _Torch:
            def __getattr__(self, name):
                return getattr(torch, name)

            @staticmethod
            def empty(*a, **kw):
                t = torch.empty(*a, **kw)
                return t.fill_(value) if kw.get("dtype") == torch.float32 else t

        self._monkeypatch.setattr(self._module, "torch", _Torch())


@pytest.fixture
def bwd_launches(monkeypatch):
    """A LaunchRecorder over fa4.sm90.bwd_launch (restored after the test)."""
    return LaunchRecorder(monkeypatch)
