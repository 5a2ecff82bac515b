"""The one cache of compiled kernels of this process, for every kernel of every pass.

Keys are the kernels' compile keys (fa4.sm90.compile / bwd_compile), which hold only what the
generated code depends on; a compile takes seconds, so two threads asking for the same key
wait for one compile instead of running two.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

_compiled: dict = {}
_lock = threading.Lock()


def compiled(key, build: Callable[[], Any]):
    """The compiled kernel of ``key``, built by ``build()`` on first use."""
    fn = _compiled.get(key)
    if fn is None:
        with _lock:
            fn = _compiled.get(key)
            if fn is None:
                fn = build()
                _compiled[key] = fn
    return fn
