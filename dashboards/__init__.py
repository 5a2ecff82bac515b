"""The web dashboard: one static page that reads the REST API of ``service`` and nothing else.

``mount(app)`` serves the page at ``/`` and its assets (our script and stylesheet, the vendored
Apache ECharts) under ``/static``; everything shown is computed in the browser from ``/v1/...``
answers, so the dashboard and API clients always see the same data.
"""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).resolve().parent / "static"


def mount(app) -> None:
    """Add the dashboard routes to a FastAPI ``app`` (kept out of its OpenAPI schema)."""
    from fastapi.responses import FileResponse
    from fastapi.staticfiles import StaticFiles

    index = STATIC_DIR / "index.html"

    @app.get("/", include_in_schema=False)
    def dashboard_index():
        # no-cache: the page is tiny, and a stale copy would ask for assets that moved.
        return FileResponse(index, media_type="text/html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static")
