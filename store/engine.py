"""Where the results database lives, and an engine that behaves under concurrency."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url

ENV_VAR = "FA4_DB"
APP_NAME = "fa4-tune"
DB_FILENAME = "results.db"

# How long a SQLite writer waits for another process's write lock before giving
# up. A tuner trial writes a handful of rows, so waits are short; the bound only
# matters when something holds the lock pathologically long.
SQLITE_BUSY_TIMEOUT_S = 60.0

# Execution option that marks a connection as read-only, so SQLite can start it
# with a deferred BEGIN instead of taking the write lock.
READ_ONLY = "fa4_read_only"


def default_url() -> str:
    """``$FA4_DB`` if set, else a SQLite file in the user's data directory."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return env
    import platformdirs

    return f"sqlite:///{Path(platformdirs.user_data_dir(APP_NAME)) / DB_FILENAME}"


def resolve_url(url: str | URL | None = None) -> URL:
    """Normalise what a user passed (``--db``): None, a SQLAlchemy URL, or a bare file path."""
    if url is None or (isinstance(url, str) and not url.strip()):
        url = default_url()
    if isinstance(url, str) and "://" not in url:
        # A bare path is the common case on a workstation: treat it as a SQLite file.
        url = f"sqlite:///{Path(url).expanduser().resolve()}"
    return make_url(url)


def sqlite_file(url: URL) -> Path | None:
    """The file behind a SQLite URL, or None for in-memory and non-SQLite URLs."""
    if url.get_backend_name() != "sqlite":
        return None
    db = url.database
    if not db or db == ":memory:" or db.startswith("file:") or url.query.get("mode") == "memory":
        return None
    return Path(db).expanduser()


def masked(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def make_engine(url: URL) -> Engine:
    if url.get_backend_name() != "sqlite":
        # pool_pre_ping: a long tuner run outlives server-side idle timeouts.
        return create_engine(url, pool_pre_ping=True)

    path = sqlite_file(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
    _tune_sqlite(engine, wal=path is not None)
    return engine


def retry_locked(statement, timeout_s: float, first_delay_s: float = 0.005):
    """Run ``statement`` again while SQLite answers "database is locked", up to ``timeout_s``.

    For the switch of a fresh file to WAL: it needs the file to itself, and when several
    processes open a new database at once, SQLite refuses it at once instead of waiting on
    busy_timeout (a connection holding a shared lock while another waits to write would
    deadlock), seen in tests/service/test_db.py's concurrent writers. WAL persists in the file,
    so a retry finds it switched by another process, or the file free.
    """
    deadline = time.monotonic() + timeout_s
    delay = first_delay_s
    while True:
        try:
            return statement()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(2 * delay, 0.1)


def _tune_sqlite(engine: Engine, wal: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Take transaction control away from the sqlite3 module: its implicit BEGIN
        # is emitted lazily before the first write, so a transaction that reads and
        # then writes can fail with "database is locked" without ever waiting on the
        # busy timeout (the lock upgrade would deadlock). We emit BEGIN ourselves.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
            cur.execute("PRAGMA foreign_keys = ON")
            if wal:
                # WAL lets readers (the service, dashboards) proceed while a tuner writes.
                retry_locked(lambda: cur.execute("PRAGMA journal_mode = WAL"), SQLITE_BUSY_TIMEOUT_S)
                # In WAL mode NORMAL never corrupts; it only risks the last commits on power loss.
                cur.execute("PRAGMA synchronous = NORMAL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        # Writers take the write lock up front, where busy_timeout applies, so
        # concurrent writers queue instead of failing. Readers stay deferred.
        if conn.get_execution_options().get(READ_ONLY):
            conn.exec_driver_sql("BEGIN")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
