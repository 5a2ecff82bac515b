"""Alembic environment for the results database.

Normally driven by ``store.migrate.upgrade_to_head``, which hands over an
open connection (inside a transaction) through ``config.attributes``. Offline
mode (``--sql``) renders the DDL for a DBA from ``sqlalchemy.url``.
"""

from alembic import context

from store.models import VERSION_TABLE, Base

config = context.config
target_metadata = Base.metadata


def _options() -> dict:
    return {
        "target_metadata": target_metadata,
        "version_table": config.get_main_option("version_table", VERSION_TABLE),
        # SQLite cannot ALTER most things in place; batch mode copies the table.
        "render_as_batch": True,
        "compare_type": True,
    }


def run_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True, **_options())
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        from store.engine import make_engine, resolve_url

        engine = make_engine(resolve_url(config.get_main_option("sqlalchemy.url")))
        with engine.begin() as connection:
            context.configure(connection=connection, **_options())
            context.run_migrations()
        engine.dispose()
        return
    context.configure(connection=connection, **_options())
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
