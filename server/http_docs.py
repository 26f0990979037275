"""The OpenAPI docs page of every Tidal API, served offline.

FastAPI's default `/docs` loads Swagger UI from a CDN, so it is blank on a machine
without internet access. Here, Swagger UI's files come from the `fastapi-swagger` wheel,
which ships the upstream distribution and tracks its releases, and the API serves them
itself. ReDoc, also from a CDN, is off. The bearer token is entered with Swagger's
Authorize button, which the OpenAPI's security scheme (`server.http_auth.BEARER`)
provides; it is kept in the browser's storage, never in a URL.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi_swagger import patch_fastapi

DOCS_APP_ARGS: dict[str, Any] = {
    "docs_url": None,
    "redoc_url": None,
    "swagger_ui_oauth2_redirect_url": None,
}
"""Pass to `FastAPI(...)`: `serve_docs_offline` adds its own /docs."""


def serve_docs_offline(app: FastAPI) -> None:
    """`/docs` with Swagger UI's script, style and icon served by `app` itself."""
    patch_fastapi(
        app,
        docs_url="/docs",
        redirect_from_root_to_docs=False,
        swagger_js_url="/docs/assets/swagger-ui-bundle.js",
        swagger_css_url="/docs/assets/swagger-ui.css",
        swagger_favicon_url="/docs/assets/favicon-32x32.png",
        swagger_ui_parameters={"persistAuthorization": True, "displayRequestDuration": True},
    )
