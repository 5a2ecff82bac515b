"""Database fixtures for the service tests.

Every test that takes ``db_url`` runs against a fresh SQLite file, and also
against PostgreSQL when ``FA4_TEST_PG_URL`` names a server (for example
``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``). Each PostgreSQL test
gets its own throw-away schema, so the suite never touches existing tables.
"""

from __future__ import annotations

import os
import uuid

import pytest

PG_ENV = "FA4_TEST_PG_URL"


def _backends() -> list[str]:
    return ["sqlite", "postgresql"] if os.environ.get(PG_ENV) else ["sqlite"]


@pytest.fixture(params=_backends())
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        # A directory that does not exist yet: opening the store must create it.
        yield f"sqlite:///{tmp_path / 'data' / 'results.db'}"
        return

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = make_url(os.environ[PG_ENV])
    schema = f"fa4test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    # search_path confines every table (and Alembic's version table) to the schema.
    url = base.update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def store(db_url):
    from service.db import ResultsStore

    s = ResultsStore.open(db_url)
    try:
        yield s
    finally:
        s.close()
