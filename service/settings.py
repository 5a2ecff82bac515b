"""Settings of the service, from arguments or the environment (never read at import time)."""

from __future__ import annotations

import os
from dataclasses import dataclass

TOKEN_ENV = "FA4_API_TOKEN"
CACHE_TTL_ENV = "FA4_SERVICE_CACHE_TTL_S"


@dataclass(frozen=True)
class Settings:
    # None: $FA4_DB, else the user data dir (store.default_url).
    db_url: str | None = None
    # None: writes are refused (403). Remote tuners send it as "Authorization: Bearer <token>".
    token: str | None = None
    # /v1/configs/best answers are cached until the database gains rows. Writes through
    # this service clear the cache at once; rows written by tuner processes straight into
    # the database are noticed by a cheap check made at most this often.
    best_cache_ttl_s: float = 1.0
    # Entries of each answer cache (by key, by query string), least recently used evicted:
    # answers are ~1-2 KB, so both together stay under ~40 MB however many distinct queries
    # (device strings, shapes) clients send. Far above the shapes a fleet asks about.
    best_cache_size: int = 8192
    # Problem families whose rows are kept (without samples): one per device, provider, pass,
    # dtype, head dims and flags measured and asked about.
    family_cache_size: int = 1024
    # Interpreter settings for a process that does nothing but serve (app_from_env), not for
    # test processes that build many apps: after the warm-up, gc.freeze() takes every object
    # then alive out of the collector's sight (the provider imports leave ~400k, and each full
    # collection walked them for ~0.2 s, a stall of every request); and a GIL switch interval
    # of 0.5 ms instead of 5, so a thread building a listing page hands the GIL back to the
    # event loop (lookups) within half a millisecond instead of five, at each hand-off.
    tune_process: bool = False

    @classmethod
    def from_env(cls, db_url: str | None = None, token: str | None = None) -> "Settings":
        if token is None:
            token = os.environ.get(TOKEN_ENV, "")
        ttl = os.environ.get(CACHE_TTL_ENV, "").strip()
        return cls(
            db_url=db_url,
            token=token.strip() or None,
            best_cache_ttl_s=float(ttl) if ttl else cls.best_cache_ttl_s,
        )
