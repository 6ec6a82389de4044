"""``/docs`` works offline and on a server with tokens: the page and its Swagger UI files
come from this server without a token, name no outside host, and the page's script puts
the token it is given on the requests Swagger UI makes (run in node when it is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from typing import Iterator

import httpx
import pytest

from ...servers import AUTH, ROOT, running

TOKEN = "tok-docs-0123456789"


@pytest.fixture(scope="module")
def secured() -> Iterator[str]:
    with running(REMOTE_AUTOGRAD_TOKENS=TOKEN) as server:
        yield server.url


class _Links(HTMLParser):
    """Every URL the page makes the browser load (scripts, stylesheets, icons, images), its inline
    scripts and styles, and its input fields."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.scripts: list[str] = []
        self.styles: list[str] = []
        self.inputs: list[dict] = []
        self._inside: list[str] | None = None  # the list an inline script's or style's text goes to

    def handle_starttag(self, tag: str, attrs: list) -> None:
        found = dict(attrs)
        for key in ("src", "href"):
            if found.get(key):
                self.urls.append(found[key])
        if tag == "input":
            self.inputs.append(found)
        inline = {"script": self.scripts, "style": self.styles}.get(tag)
        self._inside = inline if inline is not None and not found.get("src") else None

    def handle_endtag(self, tag: str) -> None:
        self._inside = None

    def handle_data(self, data: str) -> None:
        if self._inside is not None:
            self._inside.append(data)


def _page(url: str) -> _Links:
    r = httpx.get(url + "/docs", timeout=30)  # no token
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    links = _Links()
    links.feed(r.text)
    return links


def test_docs_page_and_its_assets_load_without_a_token_or_another_host(secured: str):
    links = _page(secured)
    assert sorted(links.urls) == ["/docs/assets/favicon.png", "/docs/assets/swagger-ui-bundle.js",
                                  "/docs/assets/swagger-ui.css"]
    for path in links.urls:  # relative to this server: no CDN, nothing a host offline cannot reach
        r = httpx.get(secured + path, timeout=30)
        assert r.status_code == 200 and len(r.content) > 1000, path
    assert "SwaggerUIBundle" in httpx.get(secured + "/docs/assets/swagger-ui-bundle.js", timeout=30).text
    (script,) = links.scripts
    assert not re.search(r"https?://|//[a-z]", script), "the page's script names an outside host"
    assert '"validatorUrl": null' in script  # Swagger UI would otherwise call validator.swagger.io


def test_the_page_has_one_token_input(secured: str):
    """The page's own field; Swagger UI's Authorize button and its per-operation locks (a second
    way to type the same token, which could not load the document) are hidden."""
    page = _page(secured)
    assert [i.get("id") for i in page.inputs] == ["token"] and page.inputs[0]["type"] == "password"
    css = re.sub(r"/\*.*?\*/", "", "".join(page.styles), flags=re.S)
    rules = re.findall(r"([^{}]+)\{([^}]*)\}", css)
    hidden = {sel.strip() for selectors, body in rules if "display: none" in body for sel in selectors.split(",")}
    assert {".swagger-ui .auth-wrapper", ".swagger-ui .authorization__btn"} <= hidden, rules


def test_openapi_still_needs_the_token_the_page_sends(secured: str):
    assert httpx.get(secured + "/openapi.json", timeout=30).status_code == 401
    r = httpx.get(secured + "/openapi.json", headers={AUTH: f"Bearer {TOKEN}"}, timeout=30)
    assert r.status_code == 200
    schemes = r.json()["components"]["securitySchemes"]
    assert schemes["bearer"] == {**schemes["bearer"], "type": "http", "scheme": "bearer"}  # for other tools
    assert "/docs" not in r.json()["paths"] and "/redoc" not in r.json()["paths"]


NODE_HARNESS = r"""
// The page's script with the browser's objects it touches replaced by stand-ins, run three times:
// no token (the document answers 401), a token it accepts, a token it refuses.
const store = new Map();
globalThis.sessionStorage = {getItem: (k) => store.has(k) ? store.get(k) : null,
                             setItem: (k, v) => store.set(k, v), removeItem: (k) => store.delete(k)};
const element = {addEventListener: () => {}, textContent: "", value: ""};
globalThis.document = {getElementById: () => element};
globalThis.location = {reload: () => {}};
let config = null;
globalThis.SwaggerUIBundle = (c) => { config = c; return {}; };
SwaggerUIBundle.presets = {apis: "apis-preset"};
globalThis.window = globalThis;
const script = require("fs").readFileSync(0, "utf8");
const DOCUMENT = {openapi: "3.1.0", info: {title: "the real one"}, paths: {"/v1/ops": {}}};
async function run(token, status) {
  store.clear();
  if (token) store.set("remote-autograd-token", token);
  const asked = [];
  globalThis.fetch = async (url, init) => {
    asked.push({url, headers: init.headers});
    return {ok: status === 200, status, json: async () => DOCUMENT};
  };
  config = null;
  eval(script);
  await new Promise((resolve) => setTimeout(resolve, 0));
  return {asked, url: config.url, spec: config.spec, validatorUrl: config.validatorUrl,
          without: config.requestInterceptor({headers: {}}).headers,
          authorized: config.requestInterceptor({headers: {Authorization: "Bearer from-dialog"}}).headers};
}
(async () => {
  console.log(JSON.stringify({none: await run(null, 401), good: await run("tok-1", 200),
                              refused: await run("tok-2", 401)}));
})();
"""


def test_page_script_reads_the_document_with_the_token_or_shows_the_first_screen(secured: str, tmp_path):
    """Never Swagger UI's red "Failed to load API definition": without a token the first screen
    (paste a token; the SPEC and the curl walkthrough), with one the document read with it, and
    every request Swagger UI makes then carries it."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    (script,) = _page(secured).scripts
    harness = tmp_path / "harness.js"
    harness.write_text(NODE_HARNESS)
    out = subprocess.run([node, str(harness)], input=script, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    for case in seen.values():
        assert "url" not in case and case["validatorUrl"] is None  # Swagger UI is handed the document itself
        assert [a["url"] for a in case["asked"]] == ["/openapi.json"]
        assert case["authorized"] == {"Authorization": "Bearer from-dialog"}  # a request's own token stays
    none, good, refused = seen["none"], seen["good"], seen["refused"]
    assert none["asked"][0]["headers"] == {} and none["without"] == {}
    first = none["spec"]["info"]["description"]
    assert none["spec"]["paths"] == {} and first.startswith("**This server needs a token to show its API.**")
    assert "Paste one of its tokens" in first and "[SPEC.md](/docs/SPEC.md)" in first and "§12" in first
    assert "examples/curl.sh" in first and "programs §3" in first
    assert good["asked"][0]["headers"] == {"Authorization": "Bearer tok-1"} and good["spec"]["info"]["title"] == "the real one"
    assert good["without"] == {"Authorization": "Bearer tok-1"}
    assert refused["spec"]["info"]["description"].startswith("**This server refused that token")


def test_the_protocol_documents_are_served_without_a_token(secured: str):
    spec = (ROOT / "proto" / "SPEC.md").read_bytes()
    for path, text in (("/docs/SPEC.md", spec), ("/docs/SPEC-examples.md", (ROOT / "proto" / "SPEC-examples.md").read_bytes())):
        r = httpx.get(secured + path, timeout=30)
        assert r.status_code == 200 and r.headers["content-type"] == "text/plain; charset=utf-8" and r.content == text
    described = httpx.get(secured + "/openapi.json", headers={AUTH: f"Bearer {TOKEN}"}, timeout=30).json()
    info = described["info"]["description"]  # the top of /docs once the document loads
    assert "[SPEC.md](/docs/SPEC.md)" in info and "examples/curl.sh" in info
    run = described["paths"]["/v1/sessions/{sid}/programs"]["post"]["description"]
    assert "SPEC.md §3, Programs" in run
