"""The documentation site: `mkdocs build --strict` passes (a broken link, a page missing from the nav or an API name
that does not resolve fails it), and the built site, served over HTTP, renders in headless Chromium (Debian's
package, driven by Playwright): the home page, the API reference generated from the docstrings, and search."""

import functools
import http.server
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stderr[-4000:]
    return out


def test_the_site_builds_strictly(site: pathlib.Path):
    assert (site / "index.html").exists() and (site / "api" / "index.html").exists()
    assert (site / "search" / "search_index.json").stat().st_size > 10_000


@pytest.fixture(scope="module")
def served(site: pathlib.Path):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("Debian's chromium is not installed; .ci/run installs it")
        pytest.skip("Debian's chromium is not installed (apt-get install chromium); CI installs it and runs this")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def test_home_api_and_search_render(served: str, browser):
    page = browser.new_page()
    page.goto(served + "/")
    assert page.title() == "fragc"
    assert "fragmented dataflow graph" in page.locator("article").inner_text()

    page.goto(served + "/api/")
    headings = page.locator(".doc-heading")
    assert headings.count() > 20  # one per documented name and member
    text = page.locator("article").inner_text()
    assert "Compile algo under policy on devices" in text  # fragc.api.compile's docstring, rendered
    assert "iterations_per_dispatch" in text

    page.goto(served + "/")
    page.fill("input[data-md-component=search-query]", "fragment")
    page.wait_for_selector(".md-search-result__item", timeout=30_000)
    assert page.locator(".md-search-result__item").count() >= 3
