"""``/docs``: Swagger UI served from this server alone, usable on a server with tokens.

FastAPI's own page loads Swagger UI from a CDN, which a GPU host without internet
cannot reach, and fetches ``/openapi.json`` with no way to send a bearer token. This
page serves the Swagger UI files that the ``fastapi-offline`` package ships (read
once, kept in memory) and asks for a token in the page itself: it is kept in the
tab's ``sessionStorage`` and added to every request Swagger UI makes, the OpenAPI
document included. That field is the page's one token input: Swagger's own Authorize
button (drawn for the ``bearer`` scheme of ``service.http.openapi``, which stays in the document
for other tools) is hidden, as it could not load the document and would be a second
place to type the same token.

The page and its assets need no token (``PAGE_PATHS``, public in ``service.http.auth``):
they hold nothing of the server's. ``/openapi.json`` and the API keep needing one.
"""

from __future__ import annotations

import importlib.resources
import json
from functools import cache

from fastapi import FastAPI
from starlette.responses import HTMLResponse, Response

DOCS_PATH = "/docs"
ASSETS_PATH = DOCS_PATH + "/assets"
# The only files served, by their fixed names (never a path taken from the request).
ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon.png": "image/png"}
PAGE_PATHS = frozenset({DOCS_PATH, *(f"{ASSETS_PATH}/{name}" for name in ASSETS)})
_ASSET_PACKAGE = "fastapi_offline"  # ships Swagger UI 5 (OpenAPI 3.1, which FastAPI writes)

# Swagger UI's defaults as FastAPI sets them, plus: no validator badge (it calls validator.swagger.io).
_UI_PARAMETERS = {"dom_id": "#swagger-ui", "layout": "BaseLayout", "deepLinking": True, "showExtensions": True,
                  "showCommonExtensions": True, "validatorUrl": None}

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{title}: API</title>
<link rel="stylesheet" href="{assets}/swagger-ui.css">
<link rel="icon" href="{assets}/favicon.png">
<style>
  #token-bar {{ font-family: sans-serif; padding: 8px 20px; background: #f4f4f4; border-bottom: 1px solid #ddd; }}
  #token-bar input {{ width: 28em; }}
  /* the token bar is the one token input: no Authorize button, no lock on each operation */
  .swagger-ui .auth-wrapper, .swagger-ui .authorization__btn {{ display: none; }}
</style>
</head>
<body>
<form id="token-bar">
  <label>Bearer token (a server with REMOTE_AUTOGRAD_TOKENS needs one to read the API):
    <input id="token" type="password" autocomplete="off"></label>
  <button type="submit">Use token</button> <button type="button" id="forget">Forget</button>
  <span id="token-state"></span>
</form>
<div id="swagger-ui"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script>
const KEY = "remote-autograd-token";
const token = () => sessionStorage.getItem(KEY);
document.getElementById("token-state").textContent = token() ? "(a token is set for this tab)" : "";
document.getElementById("token-bar").addEventListener("submit", (event) => {{
  event.preventDefault();
  sessionStorage.setItem(KEY, document.getElementById("token").value.trim());
  location.reload();
}});
document.getElementById("forget").addEventListener("click", () => {{
  sessionStorage.removeItem(KEY);
  location.reload();
}});
const parameters = {parameters};
parameters.url = {openapi};
parameters.presets = [SwaggerUIBundle.presets.apis];
// The token goes on every request Swagger UI makes (the OpenAPI document and "Try it out"),
// unless the request already carries one.
parameters.requestInterceptor = (request) => {{
  if (token() && !request.headers.Authorization) {{
    request.headers.Authorization = "Bearer " + token();
  }}
  return request;
}};
window.ui = SwaggerUIBundle(parameters);
</script>
</body>
</html>
"""


@cache
def _asset(name: str) -> bytes:
    return (importlib.resources.files(_ASSET_PACKAGE) / "static" / name).read_bytes()


def install(app: FastAPI) -> None:
    """Add ``/docs`` and its assets to ``app`` (created with ``docs_url=None, redoc_url=None``)."""
    page = _PAGE.format(title=app.title, assets=ASSETS_PATH, openapi=json.dumps(app.openapi_url),
                        parameters=json.dumps(_UI_PARAMETERS))

    @app.get(DOCS_PATH, include_in_schema=False)
    async def docs_page() -> HTMLResponse:
        return HTMLResponse(page)

    for name, media_type in ASSETS.items():
        app.add_api_route(f"{ASSETS_PATH}/{name}", _asset_route(name, media_type), methods=["GET"],
                          include_in_schema=False, name=f"docs_asset_{name}")


def _asset_route(name: str, media_type: str):
    async def asset() -> Response:
        return Response(_asset(name), media_type=media_type, headers={"cache-control": "public, max-age=86400"})
    return asset
