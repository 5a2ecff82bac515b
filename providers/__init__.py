"""Registry of attention implementations the tuner and the benchmarks can run.

A provider is named by a spec string:
  "NAME"          a registered provider (see ``list_providers()``);
  "NAME:ARG"      a registered provider built with one argument (``replay:path/to/recording.json``);
  "module:attr"   any importable Provider class or factory (used by tests and plug-ins).
Specs are strings so that worker processes can rebuild the same provider.
"""

from __future__ import annotations

import importlib
from typing import Callable, Union

from .base import Provider, ProviderError

Factory = Union[Callable[..., Provider], str]

_REGISTRY: dict[str, Factory] = {}
_CACHE: dict[str, Provider] = {}


def register(name: str, factory: Factory) -> None:
    """Register a provider class/factory, or a lazy "module:attr" path to one."""
    _REGISTRY[name] = factory
    _CACHE.pop(name, None)


def list_providers() -> list[str]:
    return list(_REGISTRY)


def _resolve(factory: Factory) -> Callable[..., Provider]:
    if isinstance(factory, str):
        mod, _, attr = factory.partition(":")
        return getattr(importlib.import_module(mod), attr)
    return factory


def get_provider(spec: str) -> Provider:
    if spec in _CACHE:
        return _CACHE[spec]
    name, sep, arg = spec.partition(":")
    if name in _REGISTRY:
        factory = _resolve(_REGISTRY[name])
        provider = factory(arg) if sep else factory()
    elif sep and name and arg.isidentifier():
        try:
            provider = _resolve(spec)()
        except (ImportError, AttributeError) as e:
            raise ProviderError(f"cannot load provider {spec!r}: {e}") from None
    else:
        raise ProviderError(f"unknown provider {spec!r} (known: {', '.join(list_providers())})")
    _CACHE[spec] = provider
    return provider


register("flash-attn-4", "providers.flash_attn4:FlashAttn4Provider")
register("cudnn", "providers.sdpa:CudnnProvider")
register("fa2", "providers.sdpa:Fa2Provider")
register("fa4", "providers.fa4_provider:Fa4Provider")
register("replay", "providers.replay:ReplayProvider")

__all__ = ["Provider", "ProviderError", "get_provider", "list_providers", "register"]
