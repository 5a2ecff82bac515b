"""Facts about the measuring machine that are stored with every result."""

from __future__ import annotations

import functools
import subprocess
from importlib.metadata import PackageNotFoundError, version


def _pkg_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _driver_version() -> str | None:  # cached: a fleet worker asks once per shape
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    line = out.stdout.strip().splitlines()
    return line[0].strip() if out.returncode == 0 and line else None


def cuda_device_info(provider_versions: dict | None = None) -> dict:
    """The current CUDA device, in the shape ResultsStore.upsert_device takes."""
    import torch

    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    return {
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "l2_bytes": int(getattr(props, "L2_cache_size", 0) or 0),
        "memory_bytes": int(props.total_memory),
        "driver": _driver_version(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "cutlass_dsl": _pkg_version("nvidia-cutlass-dsl"),
        "provider_versions": dict(provider_versions or {}),
    }


def _cuda_driver():
    """(libcuda, visible device count) after cuInit, or None without a working driver."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count = ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    return lib, count.value


@functools.lru_cache(maxsize=1)
def cuda_device_count() -> int:
    """GPUs the CUDA driver shows this process (CUDA_VISIBLE_DEVICES applies), asked through the
    driver API itself: importing torch with its CUDA libraries takes seconds, and the fa4-tune
    parent asks before it starts its workers, so those seconds sat on every fleet run's clock
    (the workers import torch themselves). 0 without a driver."""
    driver = _cuda_driver()
    return driver[1] if driver else 0


def format_uuid(raw: bytes) -> str:
    """The 16 bytes of a CUDA device UUID as nvidia-smi and CUDA_VISIBLE_DEVICES write it."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@functools.lru_cache(maxsize=1)
def cuda_device_uuids() -> tuple[str, ...]:
    """The UUID of each GPU the CUDA driver shows this process, by CUDA ordinal (the numbering
    CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER give it, which is what a worker started with
    CUDA_VISIBLE_DEVICES=<ordinal> gets). From the driver API, like cuda_device_count: no
    nvidia-smi process on the path to the workers' start. Empty without a driver."""
    import ctypes

    driver = _cuda_driver()
    if driver is None:
        return ()
    lib, count = driver
    get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
    out = []
    for i in range(count):
        dev = ctypes.c_int(0)
        raw = (ctypes.c_ubyte * 16)()
        if lib.cuDeviceGet(ctypes.byref(dev), i) != 0 or get_uuid(raw, dev) != 0:
            return ()
        out.append(format_uuid(bytes(raw)))
    return tuple(out)


def has_cuda() -> bool:
    """A CUDA GPU is visible to this process (whether torch can use it is the provider's check)."""
    return cuda_device_count() > 0
