"""The results database: devices, problems, configs and measurements.

    from store import ResultsStore
    store = ResultsStore.open()          # $FA4_DB, else <user data dir>/fa4-tune/results.db
    dev = store.upsert_device({...}); prob = store.upsert_problem(problem)
    cfg = store.upsert_config("flash-attn-4", {"tile_m": 128, ...}, KnobClass)
    store.add_measurement(dev, prob, cfg, status="ok", samples_ms=[...], median_ms=..., tflops=...)
    store.best("NVIDIA H200", "flash-attn-4", problem)

Any SQLAlchemy URL works (SQLite, PostgreSQL); the schema is migrated to the
newest Alembic revision on open.
"""

from .engine import ENV_VAR, default_url, resolve_url
from .models import STATUSES
from .store import ResultsStore, canonical_json

__all__ = ["ENV_VAR", "STATUSES", "ResultsStore", "canonical_json", "default_url", "resolve_url"]
