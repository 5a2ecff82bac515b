"""The demo dataset holds exactly the recorded H200 measurements, loaded through ResultsStore."""

from __future__ import annotations

import json
import shutil

import pytest

from dashboards import demo
from fa4.problem import Problem
from service.db import ResultsStore


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo") / "demo.db"
    counts = demo.build_demo_db(f"sqlite:///{path}")
    store = ResultsStore.open(f"sqlite:///{path}")
    yield store, counts
    store.close()


def _log_lines():
    return demo.BENCH_LOG.read_text().splitlines()


def test_seed_db_rows_are_copied_unchanged(demo_store, tmp_path):
    store, counts = demo_store
    copy = tmp_path / "seed.sqlite"
    shutil.copyfile(demo.SEED_DB, copy)
    seed = ResultsStore.open(f"sqlite:///{copy}")
    try:
        rows = seed.measurements(sort="id")
    finally:
        seed.close()
    assert counts["seed_db"] == len(rows) > 0
    studies = {r["study_name"] for r in rows}
    for study in studies:
        want = [(r["trial_number"], r["status"], r["reason"], r["tflops"], r["config"], r["is_default"],
                 r["samples_ms"], r["created_at"]) for r in rows if r["study_name"] == study]
        got = [(r["trial_number"], r["status"], r["reason"], r["tflops"], r["config"], r["is_default"],
                r["samples_ms"], r["created_at"]) for r in store.measurements(study_name=study, sort="id")]
        assert got == want


def test_reference_sweep_is_one_study_per_shape(demo_store):
    store, counts = demo_store
    rec = json.loads(demo.REF_SWEEP.read_text())
    assert counts["ref_sweep"] == sum(len(p["results"]) for p in rec["problems"])
    for entry in rec["problems"]:
        problem = Problem.from_dict(entry["problem"])
        rows = [r for r in store.measurements(provider=rec["provider"], sort="id", **{
            k: v for k, v in problem.to_dict().items()}) if r["study_name"]]
        assert [r["trial_number"] for r in rows] == list(range(len(entry["results"])))
        assert [(r["status"], r["tflops"], r["reason"]) for r in rows] == [
            (x["status"], x["tflops"], x["reason"]) for x in entry["results"]]
        defaults = [r for r in rows if r["is_default"]]
        # The recorded default may appear once in the sweep; its row is the one flagged.
        recorded = [x for x in entry["results"] if all(x["config"][k] == v for k, v in entry["default"].items())]
        assert [r["tflops"] for r in defaults] == [x["tflops"] for x in recorded]
        assert len(defaults) == 1


def test_bench_log_gives_all_four_providers_over_seqlen(demo_store):
    store, counts = demo_store
    rows = [r for r in store.measurements(sort="id") if (r["versions"] or {}).get("seed_source") == demo.BENCH_LOG.name]
    assert counts["bench_log"] == len(rows)
    assert {r["provider"] for r in rows} == {"fa4", "flash-attn-4", "cudnn", "fa2"}
    for r in rows:
        p = Problem.from_dict(r["problem"])
        assert p == Problem.standard(p.seqlen_q, p.head_dim, causal=p.causal)
        assert r["is_default"] and r["status"] == "ok" and r["study_name"] is None
        # median_ms is the log's TFLOP/s turned back into time with the harness's FLOP count.
        assert p.flops / (r["median_ms"] * 1e-3) / 1e12 == pytest.approx(r["tflops"], rel=1e-12)
    # Every table line of the log is one shape; its numbers (ratios dropped) are the providers' TFLOP/s.
    header = next(line for line in _log_lines() if line.split()[:3] == ["S", "hd", "causal"])
    providers = header.split()[3:]
    table = [line.split() for line in _log_lines() if line.split()[:1] and line.split()[0].isdigit()]
    assert len(table) * len(providers) == len(rows)
    for cells in table:
        s, hd, causal = int(cells[0]), int(cells[1]), cells[2] == "yes"
        values = [float(c) for c in cells[3:] if not c.startswith("(")]
        got = {r["provider"]: r["tflops"] for r in rows
               if (r["problem"]["seqlen_q"], r["problem"]["head_dim"], r["problem"]["causal"]) == (s, hd, causal)}
        assert [got[p] for p in providers] == values
    # fa4 and flash-attn-4 ran the default the recorded runs flagged at that head_dim; cudnn and fa2
    # have no knobs.
    flagged = {}
    for r in store.measurements(is_default=True):
        if r["study_name"]:
            flagged.setdefault((r["provider"], r["problem"]["head_dim"]), set()).add(
                tuple(sorted(r["config"].items())))
    for r in rows:
        if r["provider"] in ("fa4", "flash-attn-4"):
            assert flagged[(r["provider"], r["problem"]["head_dim"])] == {tuple(sorted(r["config"].items()))}
        else:
            assert r["config"] is None


def test_demo_refuses_a_database_with_measurements(demo_store, tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    demo.build_demo_db(url)
    with pytest.raises(ValueError, match="already holds measurements"):
        demo.build_demo_db(url)


def test_bench_log_parser_rejects_a_row_with_missing_cells():
    text = "     S   hd causal   fa4   fa2\n  1024   64     no   307.2 (0.78)\n\nNVIDIA H200, 2026; TFLOP/s (ratio)"
    with pytest.raises(ValueError, match="1 cells for 2 providers"):
        demo.parse_bench_log(text)
    parsed = demo.parse_bench_log(text.replace("307.2 (0.78)", "307.2 (0.78)   - error"))
    assert [(r["provider"], r["status"], r["tflops"]) for r in parsed["rows"]] == [
        ("fa4", "ok", 307.2), ("fa2", "error", None)]
