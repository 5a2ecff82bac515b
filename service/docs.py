"""/docs without internet: Swagger UI from files shipped in the package, not from a CDN.

FastAPI's default /docs page loads swagger-ui-dist from jsDelivr, so on an offline machine it
is blank. The assets are vendored under service/static/swagger-ui (swagger-ui-dist, Apache 2.0,
VERSION says which); ReDoc is not vendored, so its CDN page is turned off rather than left blank.
"""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "static" / "swagger-ui"
ASSETS_PATH = "/docs-assets"


def mount_docs(app) -> None:
    """Add /docs and its assets to a FastAPI ``app`` created with ``docs_url=None``."""
    from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
    from fastapi.staticfiles import StaticFiles

    redirect = "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui():
        return get_swagger_ui_html(
            openapi_url=app.openapi_url, title=f"{app.title} - Swagger UI", oauth2_redirect_url=redirect,
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js", swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon-32x32.png",
        )

    @app.get(redirect, include_in_schema=False)
    def swagger_ui_redirect():
        return get_swagger_ui_oauth2_redirect_html()

    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS), name="swagger-ui")
