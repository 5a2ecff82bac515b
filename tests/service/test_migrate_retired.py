"""Revision 0005: stored backward configs lose the fields that were never knobs, and read on."""

from __future__ import annotations

import json

from alembic import command
from sqlalchemy import create_engine, text

from fa4.knobs import config_from_dict
from fa4.problem import Problem
from fa4.sm90.bwd_config import BwdConfigSm90
from store import ResultsStore
from store.migrate import alembic_config, current_revision, head_revision

OLD_BWD = {"tile_m": 64, "tile_n": 128, "stages": 2, "ds_stages": 2, "ds_store": "stmatrix", "sdp_swap_ab": True,
           "dq_accum": "bulk", "dq_split": "head_dim", "dkv_store": "direct", "dv_operand": "rmem",
           "spt_order": True, "head_swizzle": 1, "cluster_exchange": False}
OLD_SCHEMA = {"title": "BwdConfigSm90", "type": "object", "additionalProperties": False,
              "properties": {k: {"enum": [v]} for k, v in {**OLD_BWD, "deterministic": False}.items()}}
FWD = {"tile_m": 128, "tile_n": 176, "kv_stages": 2}  # tile_n is a real forward knob: kept


def _insert_old_rows(conn) -> None:
    conn.execute(text(
        "INSERT INTO devices (id, fingerprint, name, compute_capability, sm_count, l2_bytes, memory_bytes, "
        "provider_versions, created_at) VALUES (1, 'fp', 'NVIDIA H200', '9.0', 132, 62914560, 1, '{}', "
        "'2026-11-30 00:00:00')"))
    for pid, det, pass_ in ((1, False, "bwd"), (2, True, "bwd"), (3, False, "fwd")):
        conn.execute(text(
            "INSERT INTO problems (id, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v, dtype, "
            "causal, deterministic, pass) VALUES (:id, 2, 8192, 8192, 16, 16, 128, 128, 'bf16', 0, :det, :pass)"),
            {"id": pid, "det": det, "pass": pass_})
    configs = [(1, {**OLD_BWD, "deterministic": False}, OLD_SCHEMA), (2, {**OLD_BWD, "deterministic": True}, OLD_SCHEMA),
               (3, {**OLD_BWD, "deterministic": True, "tile_m": 128, "dq_split": "rows"}, None),
               (4, FWD, {"title": "FwdConfigSm90"})]
    ref = [(5, {"deterministic": False}, {"title": "RefFa4BwdKnobs"}), (6, {"deterministic": True}, None)]
    for cid, cfg, schema in configs + ref:
        body = json.dumps(cfg, sort_keys=True, separators=(",", ":"))
        conn.execute(text(
            "INSERT INTO configs (id, provider, config_hash, config_json, config, knob_schema) "
            "VALUES (:id, :p, :h, :t, :c, :s)"),
            {"id": cid, "p": "fa4" if cid < 5 else "flash-attn-4", "h": f"old{cid}", "t": body, "c": body,
             "s": json.dumps(schema) if schema else None})
    for mid, pid, cid, tflops in ((1, 1, 1, 500.0), (2, 2, 2, 480.0), (3, 2, 3, 490.0), (4, 3, 4, 640.0),
                                  (5, 1, 5, 520.0), (6, 2, 6, 470.0)):
        conn.execute(text(
            "INSERT INTO measurements (id, device_id, problem_id, config_id, status, samples_ms, n_samples, "
            "median_ms, tflops, source_fingerprint, is_default, created_at) VALUES (:id, 1, :pid, :cid, 'ok', "
            "'[1.0]', 1, 1.0, :t, 'src', 0, '2026-11-30 00:00:00')"),
            {"id": mid, "pid": pid, "cid": cid, "t": tflops})
    rounds = {"configs": [{**OLD_BWD, "deterministic": True}, FWD], "tflops": [[480.0, 490.0]], "order": [[0, 1]]}
    conn.execute(text(
        "INSERT INTO verdicts (id, device_id, problem_id, provider, measurement_id, significant, gain, spread, "
        "rounds, source_fingerprint, created_at) VALUES (1, 1, 2, 'fa4', 2, 0, 0.0, 0.01, :r, 'src', "
        "'2026-11-30 00:00:00')"), {"r": json.dumps(rounds)})


def test_old_backward_rows_are_rewritten_merged_and_still_served(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0003_verdicts")
        _insert_old_rows(conn)
    engine.dispose()

    with ResultsStore.open(url) as store:  # upgrades to head
        with store.engine.connect() as conn:
            assert current_revision(conn) == head_revision()
            cfgs = {r[0]: (json.loads(r[1]), r[2]) for r in conn.execute(
                text("SELECT id, config_json, config_hash FROM configs ORDER BY id"))}
            owners = dict(conn.execute(text("SELECT id, config_id FROM measurements")).all())
            rounds = json.loads(conn.execute(text("SELECT rounds FROM verdicts")).scalar())
        # The deterministic twin of config 1 became config 1: one row, both measurements.
        assert sorted(cfgs) == [1, 3, 4, 5]
        assert owners == {1: 1, 2: 1, 3: 3, 4: 4, 5: 5, 6: 5}
        # The reference's backward has no knobs now: "no config", as for SDPA.
        assert cfgs[5][0] is None
        assert store.upsert_config("flash-attn-4", None) == 5
        assert store.best("NVIDIA H200", "flash-attn-4",
                          Problem(2, 8192, 8192, 16, 16, 128, 128, deterministic=True, pass_="bwd"))["tflops"] == 470.0
        for cid in (1, 3):
            body, digest = cfgs[cid]
            assert not {"deterministic", "sdp_swap_ab", "tile_n", "cluster_exchange"} & set(body)
            assert len(digest) == 64 and config_from_dict(BwdConfigSm90, body) is not None
        assert cfgs[4][0] == FWD  # the forward's tile_n is a knob
        assert rounds["configs"] == [{k: v for k, v in OLD_BWD.items()
                                      if k not in ("tile_n", "sdp_swap_ab", "cluster_exchange")}, FWD]
        # The rewritten rows' text and hash agree (what upserts look up): the same knobs find the
        # row instead of inserting a second copy. (A knob declared after revision 0005, such as
        # dkv_split, makes today's canonical config another row, as for any knob added later.)
        assert store.upsert_config("fa4", cfgs[1][0]) == 1 and store.upsert_config("fa4", cfgs[3][0]) == 3
        prob_det = Problem(2, 8192, 8192, 16, 16, 128, 128, deterministic=True, pass_="bwd")
        best = store.best("NVIDIA H200", "fa4", prob_det)
        # The verdict (no significant gain) still serves its row, now under the merged config.
        assert best["tflops"] == 480.0 and best["config_id"] == 1
        assert config_from_dict(BwdConfigSm90, best["config"]) == BwdConfigSm90()
        prob = Problem(2, 8192, 8192, 16, 16, 128, 128, pass_="bwd")
        assert store.best("NVIDIA H200", "fa4", prob)["tflops"] == 500.0
