"""Registry of attention implementations the tuner and the benchmarks can run.

A provider is named by a spec string:
  "NAME"          a registered provider (see ``list_providers()``);
  "NAME:ARG"      a registered provider built with one argument (``replay:path/to/recording.json``);
  "plugin:module:attr"
                  a Provider subclass from an importable module (tests and plug-ins). The prefix
                  is explicit so that a mistyped name never imports a module: any other unknown
                  name is an error listing the registered ones.
Specs are strings so that worker processes can rebuild the same provider.
"""

from __future__ import annotations

import importlib
from typing import Callable, Union

from .base import Provider, ProviderError

Factory = Union[Callable[..., Provider], str]

PLUGIN = "plugin"
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
    elif name == PLUGIN and sep:
        mod, colon, attr = arg.partition(":")
        if not (mod and colon and attr.isidentifier()):
            raise ProviderError(f"a plugin provider is named {PLUGIN}:module:ClassName, got {spec!r}")
        try:
            cls = _resolve(arg)
        except (ImportError, AttributeError) as e:
            raise ProviderError(f"cannot load provider {spec!r}: {e}") from None
        if not (isinstance(cls, type) and issubclass(cls, Provider)):
            raise ProviderError(f"{spec!r} is not a Provider subclass ({type(cls).__name__} {attr})")
        provider = cls()
    else:
        raise ProviderError(f"unknown provider {spec!r} (known: {', '.join(list_providers())})")
    _CACHE[spec] = provider
    return provider


register("flash-attn-4", "providers.flash_attn4:FlashAttn4Provider")
register("cudnn", "providers.sdpa:CudnnProvider")
register("fa2", "providers.sdpa:Fa2Provider")
register("fa4", "providers.fa4_provider:Fa4Provider")
register("fa4-decode", "providers.fa4_decode:Fa4DecodeProvider")
register("replay", "providers.replay:ReplayProvider")

__all__ = ["Provider", "ProviderError", "get_provider", "list_providers", "register"]
