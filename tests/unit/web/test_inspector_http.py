"""The inspector page's routes (memstream.web.http_inspector): static files with strict
security headers, no key needed and no data in them (the backend is never asked), no inline
script or style for the CSP to forbid, user content never inserted as HTML, documented as
text in the OpenAPI document, shipped in the package."""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from html.parser import HTMLParser
from pathlib import Path

import pytest

from memstream.web.http import ROUTES
from memstream.web.http_base import PageRoute
from memstream.web.http_inspector import (
    ASSETS,
    CSP,
    FOLDER,
    INSPECTOR_ROUTES,
    PAGE_PATH,
    load,
)
from memstream.web.openapi import openapi_document
from tests.unit.builders import serve

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
JS = [a.name for a in ASSETS.values() if a.name.endswith(".js")]


def test_every_asset_has_a_route_and_every_route_is_in_the_table():
    assert {r.path for r in INSPECTOR_ROUTES} == set(ASSETS)
    assert all(r in ROUTES for r in INSPECTOR_ROUTES)
    assert all(r.method == "GET" and not r.keyed and r.body is None for r in INSPECTOR_ROUTES)


@pytest.mark.parametrize("path", sorted(ASSETS))
async def test_each_file_is_served_with_the_security_headers_and_no_backend_call(path):
    async with serve() as (client, backend):
        resp = await client.get(path)
        assert resp.status == 200
        assert resp.headers["Content-Type"] == ASSETS[path].media_type
        assert resp.headers["Content-Security-Policy"] == CSP
        assert "default-src 'self'" in CSP and "frame-ancestors 'none'" in CSP
        assert "unsafe-inline" not in CSP and "unsafe-eval" not in CSP
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["Referrer-Policy"] == "no-referrer"
        assert resp.headers["X-Frame-Options"] == "DENY"
        assert await resp.read() == load(ASSETS[path].name)
        again = await client.get(path, headers={"If-None-Match": resp.headers["ETag"]})
        assert again.status == 304 and await again.read() == b""
        assert backend.calls == []  # the page holds no data: nothing is read to serve it


async def test_only_the_listed_files_are_served():
    async with serve() as (client, _):
        for path in (f"{PAGE_PATH}/../http.py", f"{PAGE_PATH}/secret.txt", f"{PAGE_PATH}/"):
            assert (await client.get(path)).status == 404
        assert (await client.post(PAGE_PATH)).status == 405


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.script_text = ""
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.script_text += data


def test_the_page_has_nothing_inline_for_the_csp_to_forbid():
    parser = _Tags()
    parser.feed(load("index.html").decode())
    scripts = [a for t, a in parser.tags if t == "script"]
    assert scripts and all(a.get("src", "").startswith(f"{PAGE_PATH}/") for a in scripts)
    assert parser.script_text.strip() == ""
    assert parser.tags and not [t for t, a in parser.tags if "style" in a or t == "style"]
    handlers = [(t, k) for t, a in parser.tags for k in a if k.startswith("on")]
    assert handlers == []
    links = [a["href"] for t, a in parser.tags if t == "link" and a.get("href")]
    assert all(h.startswith(f"{PAGE_PATH}/") for h in links)  # no CDN, works offline


@pytest.mark.parametrize("name", JS)
def test_the_scripts_never_insert_html_nor_evaluate_strings(name):
    code = load(name).decode()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "new Function", "srcdoc"):
        assert sink not in code, f"{name} uses {sink}"
    # imports only from this origin's inspector folder
    assert set(re.findall(r'from "([^"]+)"', code)) <= {f"{PAGE_PATH}/{n}" for n in JS}


def test_the_key_goes_in_a_header_never_in_a_url():
    code = load("app.js").decode()
    assert '"X-API-Key": state.key' in code
    assert "localStorage" not in code  # sessionStorage only: gone with the tab
    templates = re.findall(r"`[^`]*`", code)  # every URL is built in a template literal
    assert any("/v1/tenants/" in t for t in templates)
    assert not [t for t in templates if "state.key" in t or "key=" in t.lower()]


def test_the_openapi_document_calls_the_pages_text():
    doc = openapi_document(ROUTES)
    for route in INSPECTOR_ROUTES:
        assert isinstance(route, PageRoute)
        op = doc["paths"][route.path]["get"]
        assert list(op["responses"]["200"]["content"]) == [route.media_type]
        assert route.media_type != "application/json" and op["security"] == []


def test_the_package_ships_every_file():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert f"memstream.web.{FOLDER}" in data["packages"]  # a declared data package
    patterns = data["package-data"][f"memstream.web.{FOLDER}"]
    for asset in ASSETS.values():
        assert (ROOT / "web" / FOLDER / asset.name).is_file()
        assert any(fnmatch(asset.name, p) for p in patterns), asset.name
