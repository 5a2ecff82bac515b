"""The dashboard routes: page and assets served from the package, kept out of the API schema."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from dashboards import STATIC_DIR
from service.app import create_app

REPO = Path(__file__).resolve().parents[2]


def test_page_and_every_asset_it_references_are_served(tmp_path):
    with TestClient(create_app(f"sqlite:///{tmp_path / 'r.db'}")) as client:
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        # Relative references, so a proxy may serve the dashboard under a prefix.
        refs = re.findall(r'(?:src|href)="(static/[^"]+)"', page.text)
        assert {"static/dash.js", "static/dash.css", "static/vendor/echarts/echarts.min.js"} <= set(refs)
        for ref in refs:
            r = client.get("/" + ref)
            assert r.status_code == 200, ref
            assert r.content == (STATIC_DIR / ref.removeprefix("static/")).read_bytes()
        # Nothing from another host: the page must work offline.
        assert not re.findall(r'(?:src|href)="(?:https?:)?//', page.text)
        paths = client.get("/openapi.json").json()["paths"]
        assert "/" not in paths and not any(p.startswith("/static") for p in paths)
        assert client.get("/static/nope.js").status_code == 404


def test_vendored_chart_library_ships_with_its_license():
    vendor = STATIC_DIR / "vendor" / "echarts"
    assert "Apache License" in (vendor / "LICENSE").read_text()[:400]
    version = re.search(r"Apache ECharts (\d+\.\d+\.\d+)", (vendor / "VERSION").read_text()).group(1)
    assert f'version="{version}"' in (vendor / "echarts.min.js").read_text()


def test_demo_flag_refuses_a_database_too():
    r = subprocess.run([sys.executable, "-m", "service.cli", "--demo", "--db", "sqlite:///x.db"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--demo serves its own temporary database" in r.stderr


def test_demo_serves_the_recorded_data_and_removes_it_on_exit(tmp_path):
    from service.demo import build_demo_db
    from tests.dashboards.test_browser import Server

    server = Server("--demo")
    try:
        total = server.get("/v1/results", limit=1)["total"]
        providers = {p["name"]: p["n_results"] for p in server.get("/v1/providers")}
    finally:
        server.stop()
    db = Path(re.search(r"demo data in sqlite:///(\S+);", server.proc.stderr.read()).group(1))
    assert not db.parent.exists(), "the temporary demo database outlived fa4-serve"
    # The served database holds what the loader takes from the recordings, nothing else.
    assert total == sum(build_demo_db(f"sqlite:///{tmp_path / 'again.db'}").values())
    assert all(providers[p] > 0 for p in ("fa4", "flash-attn-4", "cudnn", "fa2"))
