"""GPU architectures the kernels know about, and the facts feasibility checks need."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str  # "sm90", "sm100"
    major: int
    minor: int
    # Largest dynamic shared memory one CTA may opt into (cudaDevAttrMaxSharedMemoryPerBlockOptin).
    smem_per_cta: int
    # Shared memory of one SM (cudaDevAttrMaxSharedMemoryPerMultiprocessor): what the CTAs resident
    # on it share, each also holding 1 KiB the driver reserves (so smem_per_cta + 1 KiB here).
    smem_per_sm: int
    regs_per_sm: int
    max_regs_per_thread: int
    # Instruction suffix CuTe DSL compiles for ("sm_90a": wgmma and setmaxnreg need the "a" target).
    target: str

    @property
    def capability(self) -> tuple[int, int]:
        return (self.major, self.minor)


SM90 = Arch("sm90", 9, 0, 232448, 233472, 65536, 255, "sm_90a")
SM100 = Arch("sm100", 10, 0, 232448, 233472, 65536, 255, "sm_100a")

ARCHES = {a.name: a for a in (SM90, SM100)}


def arch_from_capability(major: int, minor: int) -> Arch:
    for a in ARCHES.values():
        if a.capability == (major, minor):
            return a
    raise ValueError(f"no kernels for compute capability {major}.{minor} (known: sm90, sm100)")


def current_arch() -> Arch | None:
    """The arch of the visible CUDA device, or None when there is none."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return arch_from_capability(major, minor)
