"""Optuna study storages that several tuner processes (and hosts) can share safely.

Which one to use:
  * one host, any number of worker processes: a journal file (the default, beside the
    results DB). Optuna's JournalStorage serialises writers with file locks, unlike a
    SQLite RDB under concurrent writers ("database is locked").
  * several hosts: ``postgresql://user:pass@host/db`` (Optuna's RDBStorage). Every host runs
    the same command and joins the same study.
  * ``sqlite:///file.db`` works (WAL mode and a long busy timeout are switched on) but is
    for one host only and slower than the journal under many writers.

Both kinds get heartbeats: a worker that dies in the middle of a trial (SIGKILL, a lost host,
an OOM kill) stops beating, and the next process that looks at the study marks that trial
FAIL and enqueues a retry of the same config (Optuna's RetryHeartbeatStaleTrialCallback, the
class formerly called RetryFailedTrialCallback). RDBStorage has heartbeats built in; the
journal file gets them here from one small file per running trial whose mtime is the beat.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# A trial user attribute: the trial started after its study's budget was taken by other workers'
# trials; it measured nothing and no count of the study includes it.
SURPLUS = "surplus"

HEARTBEAT_S = 10  # a beat every 10 s: cheap next to a trial (compile + timing: seconds)
GRACE_FACTOR = 3  # three missed beats = dead; one late beat under load is not
MAX_RETRY = 2  # a config that kills its worker three times is not retried again


def _retry_callback(max_retry: int):
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)


def _journal_class():
    """Defined lazily so importing this module does not import Optuna (CLI start-up time)."""
    from optuna.storages._heartbeat import BaseHeartbeat
    from optuna.storages.journal import JournalStorage
    from optuna.trial import TrialState

    class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
        """A journal file storage whose running trials beat by touching one file each."""

        def __init__(self, backend, beats_dir: Path, heartbeat_s: int, grace_s: int, callback):
            super().__init__(backend)
            self._beats = beats_dir
            self._beats.mkdir(parents=True, exist_ok=True)
            self._heartbeat_s = heartbeat_s
            self._grace_s = grace_s
            self._callback = callback

        def _beat_file(self, trial_id: int) -> Path:
            return self._beats / str(trial_id)

        def record_heartbeat(self, trial_id: int) -> None:
            self._beat_file(trial_id).touch()

        def _get_stale_trial_ids(self, study_id: int) -> list[int]:
            now = time.time()
            stale = []
            for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
                try:
                    last = self._beat_file(t._trial_id).stat().st_mtime
                except FileNotFoundError:
                    # Killed before its first beat: judge it by when it started.
                    last = t.datetime_start.timestamp() if t.datetime_start else now
                if now - last > self._grace_s:
                    stale.append(t._trial_id)
            return stale

        def get_heartbeat_interval(self) -> int | None:
            return self._heartbeat_s

        def get_heartbeat_stale_trial_callback(self):
            return self._callback

        def set_trial_state_values(self, trial_id, state, values=None) -> bool:
            changed = super().set_trial_state_values(trial_id, state, values)
            if changed and state.is_finished():
                self._beat_file(trial_id).unlink(missing_ok=True)
            return changed

    return HeartbeatJournalStorage


def _sqlite_wal(url: str) -> dict:
    """WAL lets readers run beside the one writer; the busy timeout waits instead of failing."""
    import sqlite3

    from sqlalchemy.engine import make_url

    db = make_url(url).database
    if db and db != ":memory:":
        Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(db, timeout=60) as con:
            con.execute("PRAGMA journal_mode=WAL")
    return {"connect_args": {"timeout": 60}}


def rdb_url(spec: str) -> str:
    """``postgresql://`` means psycopg2 to SQLAlchemy; we ship psycopg 3, so say so when psycopg2 is absent."""
    import importlib.util

    for prefix in ("postgresql://", "postgres://"):
        if spec.startswith(prefix) and importlib.util.find_spec("psycopg2") is None:
            return "postgresql+psycopg://" + spec[len(prefix):]
    return spec


def heartbeat_interval(heartbeat_s: int | None = None) -> int:
    """Seconds between beats: the argument, else $FA4_HEARTBEAT_S (tests use 1), else 10."""
    return int(heartbeat_s or os.environ.get("FA4_HEARTBEAT_S") or HEARTBEAT_S)


def open_storage(spec: str, heartbeat_s: int | None = None, max_retry: int = MAX_RETRY):
    """An Optuna storage from a URL (postgresql://, sqlite://, ...) or a journal file path."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    hb = heartbeat_interval(heartbeat_s)
    grace = hb * GRACE_FACTOR
    callback = _retry_callback(max_retry)
    if "://" in spec:
        import warnings

        import random

        from sqlalchemy.exc import DBAPIError

        engine_kwargs = _sqlite_wal(spec) if spec.startswith("sqlite") else {"pool_pre_ping": True}
        for attempt in range(6):
            try:
                with warnings.catch_warnings():  # heartbeats are "experimental" since Optuna 2.9
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    return optuna.storages.RDBStorage(
                        rdb_url(spec), engine_kwargs=engine_kwargs, heartbeat_interval=hb, grace_period=grace,
                        heartbeat_stale_trial_callback=callback,
                    )
            except DBAPIError:
                # Hosts starting together on an empty database race to create Optuna's tables
                # and types (PostgreSQL: duplicate key on pg_type); the loser finds them made.
                if attempt == 5:
                    raise
                time.sleep(0.2 + random.random() * 0.5 * (attempt + 1))
    path = Path(spec).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    cls = _journal_class()
    return cls(JournalFileBackend(str(path)), path.with_name(path.name + ".beats"), hb, grace, callback)


def fail_stale(study) -> None:
    """Mark trials of dead workers FAIL and enqueue their retries, now rather than at the next trial."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def masked_storage(spec: str) -> str:
    """The storage as it may be printed: a URL's password hidden."""
    if "://" not in spec:
        return spec
    from sqlalchemy.engine import make_url

    try:
        return make_url(spec).render_as_string(hide_password=True)
    except Exception:  # not a SQLAlchemy URL: show only its scheme
        return spec.split("://", 1)[0] + "://..."


def storage_kind(spec: str) -> str:
    if "://" not in spec:
        return "journal"
    return spec.split("://", 1)[0].split("+", 1)[0]
