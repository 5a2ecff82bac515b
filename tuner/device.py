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


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
