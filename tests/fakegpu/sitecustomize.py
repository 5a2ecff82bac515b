"""A fake machine with $FA4_FAKE_GPUS NVIDIA H200s, for every Python process started with this
folder on PYTHONPATH: fa4-tune, its fleet workers and their measuring processes.

CI has no GPU, so the branches that only a GPU reaches (the CUDA driver's device count and UUIDs,
the per-GPU lock, torch's device queries, the study's device record) would otherwise never run
there; one of them shipped a NameError into every plain fa4-tune run. This fakes the two things
those branches ask, at the level they ask it:

- libcuda.so.1 through ctypes (cuInit, cuDeviceGetCount, cuDeviceGet, cuDeviceGetUuid_v2), which
  honours CUDA_VISIBLE_DEVICES as the driver does (ordinals, or UUIDs);
- torch.cuda's device queries (is_available, device_count, get_device_capability,
  current_device, get_device_properties), patched when torch is imported, never importing it
  (tests check that GPU counting does not import torch).

Kernels are not faked: a provider that launches one fails loudly. Tests measure with providers
that replay recorded H200 measurements (tests/tuner/fake_providers.py: GpuReplay).
"""

from __future__ import annotations

import ctypes
import os
import sys
import types

N = int(os.environ.get("FA4_FAKE_GPUS", "0") or 0)
NAME = "NVIDIA H200 (fake)"


def uuid_bytes(physical: int) -> bytes:
    return bytes([0xF0 | physical] + [physical] * 15)


def uuid_text(physical: int) -> str:
    h = uuid_bytes(physical).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def visible() -> list[int]:
    """Physical GPUs this process sees, in CUDA ordinal order."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return list(range(N))
    out = []
    for item in (s.strip() for s in env.split(",")):
        if item.isdigit() and int(item) < N:
            out.append(int(item))
        elif item.startswith("GPU-") and item in {uuid_text(i) for i in range(N)}:
            out.append([uuid_text(i) for i in range(N)].index(item))
        else:
            break  # the driver stops at the first entry it cannot use
    return out


class FakeLibcuda:
    def cuInit(self, flags):
        return 0 if N else 100  # CUDA_ERROR_NO_DEVICE

    def cuDeviceGetCount(self, ref):
        ctypes.cast(ref, ctypes.POINTER(ctypes.c_int))[0] = len(visible())
        return 0

    def cuDeviceGet(self, ref, ordinal):
        if not 0 <= ordinal < len(visible()):
            return 101  # CUDA_ERROR_INVALID_DEVICE
        ctypes.cast(ref, ctypes.POINTER(ctypes.c_int))[0] = 1000 + visible()[ordinal]
        return 0

    def cuDeviceGetUuid_v2(self, raw, dev):
        for j, b in enumerate(uuid_bytes(dev.value - 1000)):
            raw[j] = b
        return 0


def _install_libcuda() -> None:
    real = ctypes.CDLL

    def cdll(name, *a, **kw):
        if name == "libcuda.so.1":
            return FakeLibcuda()
        return real(name, *a, **kw)

    ctypes.CDLL = cdll


def patch_torch(torch) -> None:
    cuda = torch.cuda

    def props(device=None):
        return types.SimpleNamespace(name=NAME, major=9, minor=0, multi_processor_count=132,
                                     L2_cache_size=60 * 2**20, total_memory=141 * 10**9)

    cuda.is_available = lambda: bool(visible())
    cuda.device_count = lambda: len(visible())
    cuda.get_device_capability = lambda device=None: (9, 0)
    cuda.current_device = lambda: 0
    cuda.get_device_properties = props
    cuda.get_device_name = lambda device=None: NAME


class _PatchTorchOnImport:
    """A meta-path finder that lets the real torch load, then patches its device queries."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util

            spec = importlib.util.find_spec("torch")
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch_torch(module)

        loader.exec_module = exec_and_patch
        return spec


if N > 0:
    _install_libcuda()
    if "torch" in sys.modules:
        patch_torch(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _PatchTorchOnImport())
