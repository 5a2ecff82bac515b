"""One dispatch table by architecture.

Each entry names the module that builds the forward (or backward) kernel for an arch, its
knob dataclass and feasibility function. sm_100 (Blackwell: tensor memory, 2-CTA MMA)
has a slot here but no kernel: it cannot be built or tested on the H200 we have,
and asking for it says so instead of silently running the Hopper code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fa4.arch import Arch


@dataclass(frozen=True)
class FwdEntry:
    config_cls: type
    violations: Callable
    default_config: Callable
    compile_key: Callable
    compile: Callable


def _sm90() -> FwdEntry:
    from fa4.sm90 import compile as c
    from fa4.sm90 import fwd_config as f

    return FwdEntry(f.FwdConfigSm90, f.violations, f.default_config, c.compile_key, c.compile_fwd)


_FWD: dict[str, Callable[[], FwdEntry] | None] = {
    "sm90": _sm90,
    # Blackwell forward (TMEM accumulators, tcgen05 MMA, 2-CTA) is not built yet.
    "sm100": None,
}


_entries: dict = {}


def _cached(table: str, arch: Arch, make: Callable):
    # An entry is built once per (table, arch): the backward asks for it on every call.
    key = (table, arch.name)
    entry = _entries.get(key)
    if entry is None:
        entry = _entries[key] = make()
    return entry


def fwd_entry(arch: Arch) -> FwdEntry:
    make = _FWD.get(arch.name)
    if make is None:
        raise NotImplementedError(
            f"fa4 has no forward kernel for {arch.name} yet (built: "
            f"{', '.join(k for k, v in _FWD.items() if v is not None)})"
        )
    return _cached("fwd", arch, make)


@dataclass(frozen=True)
class BwdEntry:
    config_cls: type
    violations: Callable
    default_config: Callable
    compile_key: Callable
    compile: Callable
    # launch_bwd(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, config): a config
    # already resolved and checked at the forward call, so the backward does not redo it.
    run: Callable


def _sm90_bwd() -> BwdEntry:
    from fa4.sm90 import bwd_compile as c
    from fa4.sm90 import bwd_config as f
    from fa4.sm90 import bwd_defaults as d
    from fa4.sm90 import bwd_launch as run

    # ``run`` reads launch_bwd from its module at each call, so the entry can be cached while the
    # launch stays replaceable (the tests' fakes).
    return BwdEntry(f.BwdConfigSm90, f.violations, d.default_config, c.compile_key, c.compile_bwd_main,
                    lambda *a, **kw: run.launch_bwd(*a, **kw))


# fa4.flash_attn_func's autograd (and fa4::bwd under torch.compile) runs the entry's ``run``.
_BWD: dict[str, Callable[[], BwdEntry] | None] = {"sm90": _sm90_bwd, "sm100": None}


def bwd_entry(arch: Arch) -> BwdEntry:
    make = _BWD.get(arch.name)
    if make is None:
        raise NotImplementedError(f"fa4 has no backward kernel for {arch.name} yet")
    return _cached("bwd", arch, make)


@dataclass(frozen=True)
class DecodeEntry:
    config_cls: type
    violations: Callable
    default_config: Callable
    compile_key: Callable
    compile: Callable  # the decode kernel
    compile_combine: Callable  # the split-KV combine kernel


def _sm90_decode() -> DecodeEntry:
    from fa4.sm90 import decode_compile as c
    from fa4.sm90 import decode_config as f

    return DecodeEntry(f.DecodeConfigSm90, f.violations, f.default_config, c.compile_key, c.compile_decode,
                       c.compile_combine)


# fa4.flash_attn_with_kvcache (fa4.decode) builds its plan from the entry of the tensors' arch.
_DECODE: dict[str, Callable[[], DecodeEntry] | None] = {"sm90": _sm90_decode, "sm100": None}


def decode_entry(arch: Arch) -> DecodeEntry:
    make = _DECODE.get(arch.name)
    if make is None:
        raise NotImplementedError(f"fa4 has no decode kernel for {arch.name} yet")
    return _cached("decode", arch, make)
