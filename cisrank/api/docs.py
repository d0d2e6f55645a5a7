"""`/docs` (Swagger UI) and `/redoc` from assets installed with the package, never a CDN.

Why: FastAPI's own pages load their script and styles from a public CDN, so on a host without
internet (this project's, and many production ones) `/docs` is a blank page. The `serve` extra
installs `fastapi-offline`, which ships Swagger UI 5 (the first line that renders OpenAPI 3.1,
what FastAPI writes) and ReDoc as static files; this module serves them under `ASSETS_URL` and
points both pages at them. Without that package the two pages are left out, with a warning
naming the extra, rather than served blank.
"""

from __future__ import annotations

import importlib.resources
import logging
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

log = logging.getLogger(__name__)

ASSETS_URL = "/docs-assets"
DOCS_URL = "/docs"
REDOC_URL = "/redoc"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")


def docs_assets() -> Path | None:
    """The folder of the installed Swagger UI and ReDoc files, or None without them."""
    try:
        folder = Path(str(importlib.resources.files("fastapi_offline") / "static"))
    except ModuleNotFoundError:
        return None
    return folder if all((folder / name).is_file() for name in _FILES) else None


def install_docs(app: FastAPI) -> None:
    """Serve `/docs`, its OAuth2 redirect and `/redoc` on the local assets (the app is built
    with `docs_url=None, redoc_url=None`, so FastAPI adds no CDN page of its own)."""
    assets = docs_assets()
    if assets is None:
        log.warning(
            "/docs and /redoc are off: their assets are not installed (pip install "
            "'cisrank[serve]' installs fastapi-offline)"
        )
        return
    app.mount(ASSETS_URL, StaticFiles(directory=assets), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT_URL}",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        )

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
