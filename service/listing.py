"""Listings of the results database, encoded to JSON bytes: in a worker process when served.

A page of 1000 measurements is tens of milliseconds of Python (rows to dicts, JSON), all of it
holding the GIL; built in a thread of the service, four clients paging at once kept the event
loop waiting for the GIL and lookups went from a 2 ms to a 600 ms p99. In a separate process
(``Listings(url, process=True)``, what fa4-serve uses) they share only the CPU, and the service
itself just passes bytes on. Tests, which build many apps, use the thread form.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from starlette.concurrency import run_in_threadpool

from store import ResultsStore

_store: ResultsStore | None = None  # the worker process's own store


def _open(url: str | None) -> None:
    global _store
    _store = ResultsStore.open(url)


def encode(value) -> bytes:
    return json.dumps(value, allow_nan=False).encode()


def results_page(store: ResultsStore, limit: int, offset: int, sort: str, filters: dict) -> dict:
    items = store.measurements(limit=limit, offset=offset, sort=sort, **filters)
    return {"total": store.count(**filters), "limit": limit, "offset": offset, "sort": sort, "items": items}


def study(store: ResultsStore, study_name: str) -> dict | None:
    """The GET /v1/studies/{name} answer, or None when no row has that study name."""
    rows = store.measurements(study_name=study_name, sort="trial_number")
    if not rows:
        return None
    trials = [{
        "trial_number": r["trial_number"], "measurement_id": r["id"], "status": r["status"],
        "reason": r["reason"], "config": r["config"], "tflops": r["tflops"], "median_ms": r["median_ms"],
        "error": r["error"], "is_default": r["is_default"], "created_at": r["created_at"],
    } for r in rows]
    ok = [t for t in trials if t["status"] == "ok" and t["tflops"] is not None]
    best = max(ok, key=lambda t: (t["tflops"], -t["measurement_id"])) if ok else None
    first = rows[0]
    return {
        "study_name": study_name, "device": first["device"], "provider": first["provider"],
        "problem": first["problem"], "timing": first["timing"], "n_trials": len(trials), "n_ok": len(ok), "best": best, "trials": trials,
    }


def verdicts(store: ResultsStore, filters: dict) -> list[dict]:
    """The GET /v1/verdicts answer: the newest verdict of each (device, problem, provider, timing mode)."""
    out = []
    for v in store.verdicts(**filters):
        rounds = v["rounds"] if isinstance(v["rounds"], dict) else {}
        out.append({
            "id": v["id"], "study_name": v["study_name"], "device": v["device"], "provider": v["provider"],
            "problem": v["problem"], "timing": v["timing"], "significant": v["significant"], "gain": v["gain"],
            "spread": v["spread"], "rounds": len(rounds.get("tflops") or []), "created_at": v["created_at"],
            "measurement_id": v["measurement_id"], "source_fingerprint": v["source_fingerprint"],
        })
    return out


def devices(store: ResultsStore) -> list[dict]:
    counts = store.device_counts()
    return [{**d, "n_results": counts.get(d["id"], 0)} for d in store.devices()]


def _in_worker(fn, *args) -> bytes | None:
    value = fn(_store, *args)
    return None if value is None else encode(value)


class Listings:
    """Runs one of the functions above, one at a time, and returns its JSON bytes (None: no such study)."""

    def __init__(self, url: str | None, store, process: bool):
        self._url = url
        self._store = store  # () -> the service's ResultsStore, for the thread form
        self._process = process
        self._pool: ProcessPoolExecutor | None = None
        self._slots: asyncio.Semaphore | None = None

    async def run(self, fn, *args) -> bytes | None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(1)
        async with self._slots:
            if not self._process:
                return await run_in_threadpool(lambda: None if (v := fn(self._store(), *args)) is None else encode(v))
            for attempt in (1, 2):
                if self._pool is None:
                    # spawn: the service has threads (a fork would copy their locks mid-use) and torch.
                    self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                     initializer=_open, initargs=(self._url,))
                try:
                    return await asyncio.get_running_loop().run_in_executor(self._pool, _in_worker, fn, *args)
                except BrokenProcessPool:
                    # The worker died (killed, out of memory): a new one for this request and the next.
                    self._pool = None
                    if attempt == 2:
                        raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
