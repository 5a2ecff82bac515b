"""Database fixtures for the service tests.

Every test that takes ``db_url`` runs against a fresh SQLite file, and also
against PostgreSQL when ``FA4_TEST_PG_URL`` names a server (for example
``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``). Each PostgreSQL test
gets its own throw-away schema, so the suite never touches existing tables.
With ``FA4_TEST_PG=auto`` (and no URL), the session starts its own server from the
Debian postgresql package (``tests/service/pg.py``) and stops it at the end.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

import pytest

PG_ENV = "FA4_TEST_PG_URL"


def _backends() -> list[str]:
    return ["sqlite", "postgresql"] if os.environ.get(PG_ENV) else ["sqlite"]


def pytest_configure(config):
    if os.environ.get("FA4_TEST_PG") != "auto" or os.environ.get(PG_ENV):
        return
    from tests.service import pg

    root = tempfile.mkdtemp(prefix="fa4-test-pg-")
    os.environ[PG_ENV] = pg.start(root)

    def stop():
        os.environ.pop(PG_ENV, None)
        pg.stop(root)
        shutil.rmtree(root, ignore_errors=True)

    config.add_cleanup(stop)


def pytest_generate_tests(metafunc):
    # Parametrized here, not in the decorator, so a server started by pytest_configure counts.
    if "db_url" in metafunc.fixturenames:
        metafunc.parametrize("db_url", _backends(), indirect=True)


@pytest.fixture
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
    from store import ResultsStore

    s = ResultsStore.open(db_url)
    try:
        yield s
    finally:
        s.close()
