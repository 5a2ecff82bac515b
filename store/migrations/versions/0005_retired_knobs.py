"""Backward configs without the fields that were never knobs.

``BwdConfigSm90`` no longer declares ``deterministic`` (the problem's flag decides, and the
problems table already has it), ``sdp_swap_ab`` and ``tile_n`` (single-valued) and
``cluster_exchange`` (never built); the reference FA4's backward (``RefFa4BwdKnobs``) had only
``deterministic`` and has no knobs now: its configs become NULL, as for any knob-less
provider. Stored backward configs are rewritten without them:
canonical text and hash recomputed, rows that become the same config (a deterministic and a
non-deterministic twin) merged into one with their measurements repointed, and the configs
listed in verdicts' rounds rewritten alike. Nothing is lost: the mode stays on the problem.

Data only (no schema change); the downgrade restores no field: old readers take the
declared defaults for missing knobs, and the problem's mode is on its row.

Revision ID: 0005_retired_knobs
Revises: 0004_timing
Create Date: 2026-12-01
"""

import hashlib
import json

import sqlalchemy as sa
from alembic import op

revision = "0005_retired_knobs"
down_revision = "0004_timing"
branch_labels = None
depends_on = None

# Written out, not imported: a migration keeps meaning what it meant when it was written.
RETIRED = {"BwdConfigSm90": ("deterministic", "sdp_swap_ab", "tile_n", "cluster_exchange"),
           "RefFa4BwdKnobs": ("deterministic",)}
# Knob classes retired whole: what is left of their configs is "no config" (NULL).
GONE = ("RefFa4BwdKnobs",)
# Knobs only the backward declares: how a config without a stored schema is recognised.
BWD_ONLY = ("dq_accum", "dq_split", "ds_stages")


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _loads(value):
    return json.loads(value) if isinstance(value, str) else value


def _class_of(provider: str | None, config: dict | None, schema: dict | None) -> str | None:
    if not isinstance(config, dict):
        return None
    title = schema.get("title") if isinstance(schema, dict) else None
    if title in RETIRED:
        return title
    if title is None and any(k in config for k in BWD_ONLY):
        return "BwdConfigSm90"
    if title is None and provider == "flash-attn-4" and set(config) == {"deterministic"}:
        return "RefFa4BwdKnobs"
    return None


def _retired_of(config: dict | None, schema: dict | None, provider: str | None = None) -> tuple[str, ...]:
    cls = _class_of(provider, config, schema)
    return RETIRED[cls] if cls else ()


def upgrade() -> None:
    bind = op.get_bind()
    configs = sa.table(
        "configs", sa.column("id", sa.Integer), sa.column("provider", sa.String),
        sa.column("config_hash", sa.String), sa.column("config_json", sa.Text),
        sa.column("config", sa.JSON), sa.column("knob_schema", sa.JSON),
    )
    measurements = sa.table("measurements", sa.column("id", sa.Integer), sa.column("config_id", sa.Integer))
    verdicts = sa.table("verdicts", sa.column("id", sa.Integer), sa.column("rounds", sa.JSON))

    rows = bind.execute(sa.select(configs).order_by(configs.c.id)).mappings().all()
    by_key = {(r["provider"], r["config_hash"]): r["id"] for r in rows}
    for r in rows:
        config, schema = _loads(r["config"]), _loads(r["knob_schema"])
        cls = _class_of(r["provider"], config, schema)
        retired = [k for k in (RETIRED[cls] if cls else ()) if k in config]
        if not retired:
            continue
        new = {k: v for k, v in config.items() if k not in retired}
        if cls in GONE:
            new, schema = None, None
        elif isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
            schema = {**schema, "properties": {k: v for k, v in schema["properties"].items() if k not in retired}}
        text = _canonical(new)
        digest = hashlib.sha256(text.encode()).hexdigest()
        twin = by_key.get((r["provider"], digest))
        if twin is not None and twin != r["id"]:
            # Its deterministic or non-deterministic twin is already stored: one config, both rows.
            bind.execute(sa.update(measurements).where(measurements.c.config_id == r["id"]).values(config_id=twin))
            bind.execute(sa.delete(configs).where(configs.c.id == r["id"]))
        else:
            bind.execute(sa.update(configs).where(configs.c.id == r["id"]).values(
                config_hash=digest, config_json=text, config=new, knob_schema=schema))
            by_key.pop((r["provider"], r["config_hash"]), None)
            by_key[(r["provider"], digest)] = r["id"]

    for v in bind.execute(sa.select(verdicts)).mappings().all():
        rounds = _loads(v["rounds"])
        cfgs = rounds.get("configs") if isinstance(rounds, dict) else None
        if not isinstance(cfgs, list):
            continue
        cleaned = [{k: x for k, x in c.items() if k not in _retired_of(c, None)} if isinstance(c, dict) else c
                   for c in cfgs]
        if cleaned != cfgs:
            bind.execute(sa.update(verdicts).where(verdicts.c.id == v["id"]).values(
                rounds={**rounds, "configs": cleaned}))


def downgrade() -> None:
    # The dropped fields were implied (defaults, or the problem's mode): nothing to restore.
    pass
