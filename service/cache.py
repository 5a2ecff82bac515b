"""The service's in-memory caches: bounded, dropped piecewise, and filled by one build per key.

Every answer of the service is built from a few kinds of database content (the rows of one
problem family on one device, the device's own row). Entries carry *tags* naming what they were
built from, and a write drops only the tags it touched, so one tuner's trials do not empty the
answers of every other shape. Everything here runs on the event loop thread only: builds run in
the thread pool but hand their results back to the loop, which alone mutates these structures.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Awaitable, Callable, Hashable, Iterable


class Invalidations:
    """When each tag was last dropped, on a counter shared by every cache that uses it.

    A build notes ``generation`` before it reads the database; its result may be kept only if
    none of its tags was dropped since (else it may predate the write that dropped them).
    Tags come from rows in the database (device names, families), never from a client's
    query, so this stays as small as the database's catalogue.
    """

    def __init__(self):
        self.generation = 0
        self._dropped: dict[Hashable, int] = {}
        self._caches: list[TaggedLRU] = []

    def fresh(self, tags: Iterable[Hashable], since: int) -> bool:
        return all(self._dropped.get(t, 0) <= since for t in tags)

    def drop(self, tag: Hashable) -> None:
        self.generation += 1
        self._dropped[tag] = self.generation
        for c in self._caches:
            c._drop(tag)


class TaggedLRU(Mapping):
    """A mapping of at most ``maxsize`` entries, least recently used evicted first, dropped by tag."""

    def __init__(self, maxsize: int, invalidations: Invalidations):
        if maxsize < 1:
            raise ValueError(f"maxsize must be positive, got {maxsize}")
        self.maxsize = maxsize
        self._inv = invalidations
        self._data: OrderedDict[Hashable, tuple[Any, tuple]] = OrderedDict()
        self._by_tag: dict[Hashable, set] = {}
        invalidations._caches.append(self)

    def __getitem__(self, key):
        value, _ = self._data[key]
        self._data.move_to_end(key)
        return value

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def put(self, key: Hashable, value: Any, tags: tuple, since: int) -> bool:
        """Keep ``value`` unless one of its tags was dropped after ``since``; True when kept."""
        if not self._inv.fresh(tags, since):
            return False
        self._remove(key)
        self._data[key] = (value, tags)
        for t in tags:
            self._by_tag.setdefault(t, set()).add(key)
        while len(self._data) > self.maxsize:
            self._remove(next(iter(self._data)))
        return True

    def _remove(self, key) -> None:
        entry = self._data.pop(key, None)
        if entry is None:
            return
        for t in entry[1]:
            keys = self._by_tag.get(t)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_tag[t]

    def _drop(self, tag) -> None:
        for key in list(self._by_tag.get(tag, ())):
            self._remove(key)


class SingleFlight:
    """At most one build per key at a time: concurrent callers await the one already running.

    A caller joins a running build only when none of its tags was dropped since that build
    started; otherwise the build may have read the database before the write that dropped them,
    and the caller starts its own. Builds run as their own tasks, so a caller that goes away
    (a client disconnect cancels its request) does not cancel the others' answer.
    """

    def __init__(self, invalidations: Invalidations):
        self._inv = invalidations
        self._running: dict[Hashable, tuple[asyncio.Task, int]] = {}

    def __len__(self) -> int:
        return len(self._running)

    async def run(self, key: Hashable, tags: tuple, build: Callable[[int], Awaitable[Any]]) -> Any:
        running = self._running.get(key)
        if running is not None and self._inv.fresh(tags, running[1]):
            return await asyncio.shield(running[0])
        since = self._inv.generation
        task = asyncio.ensure_future(build(since))
        entry = (task, since)
        self._running[key] = entry

        def done(t: asyncio.Task) -> None:
            if self._running.get(key) is entry:
                del self._running[key]
            if not t.cancelled():
                t.exception()  # retrieved here, so a build nobody waits for any more logs no warning

        task.add_done_callback(done)
        return await asyncio.shield(task)
