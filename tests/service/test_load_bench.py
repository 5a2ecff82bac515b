"""bench/load_service.py: a short run against a live service counts every request and no errors."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from service.app import create_app
from tests.service.live import serve

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("load_service", ROOT / "bench" / "load_service.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_short_load_run_against_a_seeded_service(tmp_path):
    bench = _bench()
    url = f"sqlite:///{tmp_path / 'load.db'}"
    rows = bench.seed(url)
    assert rows == 2 * 2 * len(bench.SEQLENS) * 4
    with serve(create_app(url)) as base:
        res = asyncio.run(bench.run_load(base, rate=100, duration=1.0, connections=4))
    assert res["requests"] == 100 and res["errors"] == 0
    assert sum(res["provenance"].values()) == 100
    # The population mixes all three kinds of answer.
    assert set(res["provenance"]) == {"exact", "nearest", "default"}
    assert 0 < res["p50_ms"] <= res["p99_ms"] <= res["max_ms"]


def test_refuses_non_loopback_targets(capsys):
    with pytest.raises(SystemExit) as exc:
        _bench().main(["--url", "http://example.com:8000", "--duration", "1"])
    assert exc.value.code == 2  # a usage error, before any request
    assert "only loopback targets are allowed, not 'example.com'" in capsys.readouterr().err
