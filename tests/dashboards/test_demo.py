"""The demo dataset holds exactly the recorded H200 measurements, loaded through ResultsStore."""

from __future__ import annotations

import json
import shutil

import pytest

from service import demo
from fa4.knobs import config_from_dict
from fa4.problem import Problem
from store import ResultsStore


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

    def normalized(r):
        # A knob added since the seed was recorded appears with its declared default (the
        # behaviour those kernels had); every recorded value is kept as it was.
        from fa4.knobs import config_from_dict, config_to_dict

        cls = demo._knob_cls(r["provider"], Problem.from_dict(r["problem"]))
        if cls is None or r["config"] is None:
            return r["config"]
        full = config_to_dict(config_from_dict(cls, r["config"]))
        assert {k: full[k] for k in r["config"]} == r["config"]
        return full

    for study in studies:
        want = [(r["trial_number"], r["status"], r["reason"], r["tflops"], normalized(r), r["is_default"],
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


def _from(store, path) -> list[dict]:
    return [r for r in store.measurements(sort="id") if (r["versions"] or {}).get("seed_source") == path.name]


def _shape(r) -> tuple:
    p = r["problem"]
    return p["seqlen_q"], p["head_dim"], p["causal"]


def _check_log_shapes(path) -> set[tuple]:
    return {(row["S"], row["D"], row["causal"]) for row in demo.parse_check_log(path.read_text())["rows"]}


def test_bench_log_gives_all_four_providers_over_seqlen(demo_store):
    store, counts = demo_store
    rows = _from(store, demo.BENCH_LOG)
    assert counts["bench_log"] == len(rows)
    assert {r["provider"] for r in rows} == {"fa4", "flash-attn-4", "cudnn", "fa2"}
    for r in rows:
        p = Problem.from_dict(r["problem"])
        assert p == Problem.standard(p.seqlen_q, p.head_dim, causal=p.causal)
        assert r["is_default"] and r["status"] == "ok" and r["study_name"] is None
        # median_ms is the log's TFLOP/s turned back into time with the harness's FLOP count.
        assert p.flops / (r["median_ms"] * 1e-3) / 1e12 == pytest.approx(r["tflops"], rel=1e-12)
    # Every table line of the log is one shape; its numbers (ratios dropped) are the providers' TFLOP/s,
    # except the shapes a newer forward log timed again for all four providers (newest wins).
    header = next(line for line in _log_lines() if line.split()[:3] == ["S", "hd", "causal"])
    providers = header.split()[3:]
    retimed = _check_log_shapes(demo.FWD_LOG) if _check_log_is_newer() else set()
    table = [line.split() for line in _log_lines() if line.split()[:1] and line.split()[0].isdigit()]
    table = [c for c in table if (int(c[0]), int(c[1]), c[2] == "yes") not in retimed]
    assert len(table) * len(providers) == len(rows) > 0
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


def _check_log_is_newer() -> bool:
    return demo.MEASURED_AT[demo.FWD_LOG.name] > demo.parse_bench_log(demo.BENCH_LOG.read_text())["date"]


def _bench_table_tflops() -> dict[tuple, dict[str, float]]:
    """(seqlen, hd, causal) -> provider -> TFLOP/s of the bench_fwd.py table."""
    table = demo.parse_bench_log(demo.BENCH_LOG.read_text())
    out: dict[tuple, dict[str, float]] = {}
    for r in table["rows"]:
        if r["status"] == "ok":
            out.setdefault((r["seqlen"], r["head_dim"], r["causal"]), {})[r["provider"]] = r["tflops"]
    return out


def test_the_newer_of_two_forward_logs_gives_each_shape_its_one_measurement(demo_store):
    store, counts = demo_store
    log = demo.parse_check_log(demo.FWD_LOG.read_text())
    newer = _check_log_is_newer()
    rows = _from(store, demo.FWD_LOG)
    assert counts["fwd_log"] == len(rows) == (len(log["rows"]) * len(demo.FWD_COLUMNS) if newer else 0)
    bench = _bench_table_tflops()
    bench_sources = {demo.BENCH_LOG.name, demo.FWD_LOG.name, demo.BWD_LOG.name}
    for row in log["rows"]:
        for column, (provider, _) in demo.FWD_COLUMNS.items():
            problem = Problem.standard(row["S"], row["D"], causal=row["causal"])
            stored = [r for r in store.measurements(provider=provider, **problem.to_dict())
                      if (r["versions"] or {}).get("seed_source") in bench_sources]
            # One bench point per (shape, provider): the newer log's number, not the older one's.
            want = (demo.FWD_LOG.name, row[column]) if newer else (
                demo.BENCH_LOG.name, bench[(row["S"], row["D"], row["causal"])][provider])
            assert [(r["versions"]["seed_source"], r["tflops"]) for r in stored] == [want]
    # The forward default that ran is today's: hd64 S=8192 at 517.5 TFLOP/s in the table, 536.8 in
    # check_fwd.py minutes earlier (session 8, bench/RESULTS.md).
    rows = [r for r in store.measurements(provider="fa4", **Problem.standard(8192, 64).to_dict())
            if (r["versions"] or {}).get("seed_source") in bench_sources]
    (hd64,) = rows
    from fa4.sm90.fwd_config import FwdConfigSm90, default_config as fwd_default

    assert config_from_dict(FwdConfigSm90, hd64["config"]) == fwd_default(Problem.standard(8192, 64))
    assert round(hd64["tflops"], 1) == (536.8 if newer else 517.5)


def _markdown_table(path) -> list[dict]:
    """The rounded table check_bwd.py prints after its BENCH lines."""
    lines = [line.strip().strip("|").split("|") for line in path.read_text().splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0]]
    return [dict(zip(header, (c.strip() for c in cells))) for cells in lines[1:] if not cells[0].startswith("-")]


def test_backward_log_gives_both_modes_of_ours_and_the_reference_and_sdpa_non_deterministic(demo_store):
    store, counts = demo_store
    rows = _from(store, demo.BWD_LOG)
    assert counts["bwd_log"] == len(rows) == 4 * len(demo.BWD_COLUMNS)
    got = {(r["provider"], r["problem"]["deterministic"], r["problem"]["head_dim"], r["problem"]["causal"]): r
           for r in rows}
    assert len(got) == len(rows)
    for r in rows:
        p = Problem.from_dict(r["problem"])
        assert p == Problem.standard(8192, p.head_dim, causal=p.causal, deterministic=p.deterministic, pass_="bwd")
        assert r["is_default"] and r["status"] == "ok" and r["study_name"] is None
        # Only what the log holds: TFLOP/s, and the time it implies; no spread was measured.
        assert r["iqr_ms"] is None and r["samples_ms"] == []
        assert p.flops / (r["median_ms"] * 1e-3) / 1e12 == pytest.approx(r["tflops"], rel=1e-12)
        if r["provider"] in ("cudnn", "fa2"):
            assert r["config"] is None and not p.deterministic
        elif r["provider"] == "flash-attn-4":
            assert r["config"] is None  # its backward has no knobs: deterministic is the problem's
        else:
            # The problem carries the mode; the config dropped the retired "deterministic" knob.
            assert "deterministic" not in r["config"]
    # The printed table, rounded to whole TFLOP/s, against the stored numbers (e.g. fa4 hd128
    # non-causal: 565 non-deterministic, 552 deterministic, ratio 0.976).
    table = _markdown_table(demo.BWD_LOG)
    assert len(table) == 4
    for line in table:
        hd, causal = int(line["hd"]), line["causal"] == "True"
        # Written out here rather than taken from demo.BWD_COLUMNS, so a swapped mode there fails.
        for column, key in (("ours", ("fa4", False)), ("ours det", ("fa4", True)),
                            ("ref FA4", ("flash-attn-4", False)), ("ref FA4 det", ("flash-attn-4", True)),
                            ("cuDNN", ("cudnn", False)), ("FA2", ("fa2", False))):
            assert round(got[(*key, hd, causal)]["tflops"]) == int(line[column]), (column, hd, causal)
        ratio = got[("fa4", True, hd, causal)]["tflops"] / got[("fa4", False, hd, causal)]["tflops"]
        assert ratio == pytest.approx(float(line["det/non-det"]), abs=5e-4)
    fa4_128 = (got[("fa4", False, 128, False)]["tflops"], got[("fa4", True, 128, False)]["tflops"])
    assert tuple(round(x) for x in fa4_128) == (565, 552)
    # Labelled with the kernel that log ran: today's default (nothing pinned in MEASURED_WITH).
    from fa4.sm90.bwd_config import BwdConfigSm90, violations
    from fa4.sm90.bwd_defaults import default_config

    for (provider, det, hd, causal), r in got.items():
        if provider != "fa4":
            continue
        cfg = config_from_dict(BwdConfigSm90, r["config"])
        prob = Problem.from_dict(r["problem"])
        assert prob.deterministic is det and not violations(cfg, prob)
        assert demo.BWD_LOG.name not in demo.MEASURED_WITH and cfg == default_config(prob)


def test_check_log_parser_skips_failed_cells_and_rejects_variant_columns(tmp_path):
    text = ('device: NVIDIA H200 torch 2.11.0+cu130\n'
            'BENCH {"S": 8192, "D": 64, "causal": true, "ours": 370.5, "ours det": null} ours/ref=0.765\n')
    assert demo.parse_check_log(text) == {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "rows": [
        {"S": 8192, "D": 64, "causal": True, "ours": 370.5, "ours det": None}], "source": None}
    device = {"name": "NVIDIA H200", "torch": "2.11.0+cu130"}
    log = tmp_path / demo.BWD_LOG.name
    log.write_text(text)
    rows = demo._check_log_rows(log, device, "bwd", demo.BWD_COLUMNS)
    assert [(r["provider"], r["problem"].deterministic, r["tflops"]) for r in rows] == [("fa4", False, 370.5)]
    with pytest.raises(ValueError, match="torch 2.11.0"):
        demo._check_log_rows(log, {**device, "torch": "2.12.0"}, "bwd", demo.BWD_COLUMNS)
    log.write_text(text.replace('"ours det": null', '"ours {\\"ds_stages\\":1}": 350.0'))
    with pytest.raises(ValueError, match="ds_stages"):
        demo._check_log_rows(log, device, "bwd", demo.BWD_COLUMNS)
    with pytest.raises(ValueError, match="BENCH lines missing"):
        demo.parse_check_log("device: NVIDIA H200 torch 2.11.0+cu130\n")


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
