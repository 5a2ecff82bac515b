"""Run the packaged Alembic migrations without an alembic.ini in the working directory."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from .engine import READ_ONLY
from .models import VERSION_TABLE

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# Any constant works; it only has to be the same for every process running migrations.
_PG_MIGRATION_LOCK = 0x46A4_7E5E


def alembic_config(connection: Connection | None = None) -> Config:
    cfg = Config()
    # configparser interpolation: a '%' in the install path must be doubled.
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    cfg.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    ctx = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return ctx.get_current_revision()


def upgrade_to_head(engine: Engine) -> None:
    """Bring the schema to the newest revision; safe when several processes start at once."""
    head = head_revision()
    with engine.connect() as conn:
        conn.execution_options(**{READ_ONLY: True})
        if current_revision(conn) == head:
            return
    # One transaction for the whole upgrade: on SQLite our BEGIN IMMEDIATE (see
    # engine.py) serialises racing processes; PostgreSQL gets an advisory lock.
    # Both have transactional DDL, so a failed upgrade leaves nothing behind.
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
        command.upgrade(alembic_config(conn), "head")
