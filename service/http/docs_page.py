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

Swagger UI given the document's URL shows a red "Failed to load API definition" when the
document needs a token it has not got. So the page reads ``/openapi.json`` itself (with the
tab's token, if any) and hands Swagger UI what it got; until it gets the document it shows a
first screen instead (``FIRST_SCREEN``): paste a token, and where the protocol is written
down. The document's own first lines (``API_DESCRIPTION``, the app's description) carry the
same links.

The page, its assets and the protocol's text (``SPEC.md`` and ``SPEC-examples.md``, served
from the package as plain text) need no token (``PAGE_PATHS``, public in
``service.http.auth``): they hold nothing of the server's. ``/openapi.json`` and the API keep
needing one.
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
# The protocol's own documents, from the package (remote_autograd.proto's package data).
TEXTS = {"SPEC.md": f"{DOCS_PATH}/SPEC.md", "SPEC-examples.md": f"{DOCS_PATH}/SPEC-examples.md"}
PAGE_PATHS = frozenset({DOCS_PATH, *(f"{ASSETS_PATH}/{name}" for name in ASSETS), *TEXTS.values()})
_ASSET_PACKAGE = "fastapi_offline"  # ships Swagger UI 5 (OpenAPI 3.1, which FastAPI writes)
_SPEC = TEXTS["SPEC.md"]

# The top of /openapi.json (the app's description), and so of /docs once it loads.
API_DESCRIPTION = f"""PyTorch gradients computed on this server. Every request under `/v1` carries \
`Remote-Autograd-Protocol: 1` (and, on a server with tokens, `Authorization: Bearer <token>`); \
a whole forward and backward pass is one program (`POST /v1/sessions/{{sid}}/programs`).

- The wire protocol, every route, message and byte: [SPEC.md]({_SPEC}): routes §2, programs §3, \
steps §4, tensor encoding §7, errors §8.
- A first conversation in curl (a session, two tensors, backward, the gradient read back): \
[SPEC.md]({_SPEC}) §12, which `examples/curl.sh` of the source repository runs.
- Every message in JSON and in msgpack: [SPEC-examples.md]({TEXTS["SPEC-examples.md"]}).
- From Python: `pip install remote-autograd`, then `client.connect(url, token=...)`.
"""

# What the page shows while it cannot read /openapi.json (no token yet, or a refused one).
FIRST_SCREEN = f"""**This server needs a token to show its API.** Paste one of its tokens \
(`REMOTE_AUTOGRAD_TOKENS`: ask its operator) in the field at the top and press *Use token*; \
the routes then appear here, and *Try it out* sends the token with each call.

{API_DESCRIPTION}"""

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
// Swagger UI is handed the document, read here with the token: given the URL, it would show a red
// "Failed to load API definition" where a token is missing. Until then, the first screen.
const firstScreen = (note) => ({{openapi: "3.1.0", paths: {{}},
  info: {{title: {title_json}, version: {version}, description: (note ? "**" + note + "**\\n\\n" : "") + {first}}}}});
async function start() {{
  let spec = null, note = "";
  try {{
    const answer = await fetch(parameters.url, {{headers: token() ? {{Authorization: "Bearer " + token()}} : {{}}}});
    if (answer.ok) {{
      spec = await answer.json();
    }} else if (answer.status === 401) {{
      note = token() ? "This server refused that token: paste another one above." : "";
    }} else {{
      note = "GET " + parameters.url + " answered " + answer.status + ".";
    }}
  }} catch (error) {{
    note = "GET " + parameters.url + " failed: " + error + ".";
  }}
  delete parameters.url;
  parameters.spec = spec || firstScreen(note);
  window.ui = SwaggerUIBundle(parameters);
}}
start();
</script>
</body>
</html>
"""


@cache
def _asset(name: str) -> bytes:
    return (importlib.resources.files(_ASSET_PACKAGE) / "static" / name).read_bytes()


@cache
def _text(name: str) -> bytes:
    return (importlib.resources.files("remote_autograd.proto") / name).read_bytes()


def install(app: FastAPI) -> None:
    """Add ``/docs`` and its assets to ``app`` (created with ``docs_url=None, redoc_url=None``)."""
    page = _PAGE.format(title=app.title, assets=ASSETS_PATH, openapi=json.dumps(app.openapi_url),
                        parameters=json.dumps(_UI_PARAMETERS), title_json=json.dumps(app.title),
                        version=json.dumps(app.version), first=json.dumps(FIRST_SCREEN))

    @app.get(DOCS_PATH, include_in_schema=False)
    async def docs_page() -> HTMLResponse:
        return HTMLResponse(page)

    for name, media_type in ASSETS.items():
        app.add_api_route(f"{ASSETS_PATH}/{name}", _asset_route(name, media_type), methods=["GET"],
                          include_in_schema=False, name=f"docs_asset_{name}")
    for name, path in TEXTS.items():
        app.add_api_route(path, _text_route(name), methods=["GET"], include_in_schema=False, name=f"docs_{name}")


def _asset_route(name: str, media_type: str):
    async def asset() -> Response:
        return Response(_asset(name), media_type=media_type, headers={"cache-control": "public, max-age=86400"})
    return asset


def _text_route(name: str):
    async def text() -> Response:  # plain text: a browser shows it (markdown it might offer to download)
        return Response(_text(name), media_type="text/plain; charset=utf-8")
    return text
