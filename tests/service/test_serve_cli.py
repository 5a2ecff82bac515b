"""fa4-serve: starts uvicorn over the given database; a bad database is a one-line error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from store.migrate import head_revision
from tests.service.live import free_port

REPO = Path(__file__).resolve().parents[2]


def _env():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("FA4_API_TOKEN", None)
    return env


def test_fa4_serve_runs_the_app_over_the_database(tmp_path):
    port = free_port()
    db = tmp_path / "served.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "--db", f"sqlite:///{db}", "--host", "127.0.0.1", "--port", str(port),
         "--no-access-log"],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "fa4-serve did not come up"
                time.sleep(0.2)
        assert r.status_code == 200 and r.json()["schema_revision"] == head_revision()
        assert str(db) in r.json()["database"]
        # No token in the environment: the service is read-only.
        r = httpx.post(f"http://127.0.0.1:{port}/v1/results", json={}, headers={"Authorization": "Bearer x"})
        assert r.status_code == 403
    finally:
        proc.terminate()
        proc.wait(30)


def test_fa4_serve_reports_an_unusable_database(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "service.cli", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/x?connect_timeout=1",
         "--port", str(free_port())],
        env=_env(), capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr.startswith("fa4-serve: cannot open the results database:")
    assert "Traceback" not in r.stderr
