"""The playground at GET /, in a real browser (Debian's Chromium, driven by
Playwright), and CORS for pages on other origins."""

from __future__ import annotations

import json
import re
import shutil
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.conftest import SharedMesh
from tests.support.mesh import Mesh
from tests.support.tcp_proxy import TcpProxy

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TIMEOUT_MS = 30_000
DONE = re.compile(r"^Done: \d+ tokens$")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is installed by `make install` (system-deps)")
    with sync_playwright() as playwright:
        # Debian's Chromium, never a download; no sandbox as root.
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser, shared_mesh: SharedMesh) -> Iterator[Page]:
    context = browser.new_context(base_url=f"http://{shared_mesh.edge}")
    context.set_default_timeout(TIMEOUT_MS)
    opened = context.new_page()
    try:
        yield opened
    finally:
        context.close()


def _send(page: Page, text: str) -> None:
    page.get_by_test_id("message-input").fill(text)
    page.get_by_test_id("message-input").press("Enter")


def _metadata(page: Page, value: dict[str, object] | None) -> None:
    page.locator("details summary").click()
    page.get_by_test_id("metadata").fill(json.dumps(value) if value else "")
    page.locator("details summary").click()


def test_a_conversation_streams_shows_tools_and_survives_a_reload(
    page: Page, tmp_path: Path
) -> None:
    page.goto("/")
    expect(page).to_have_title("turnmesh playground")
    page.get_by_test_id("new-session").click()
    expect(page.get_by_test_id("session-id")).not_to_have_text("none")

    # A slow answer: text must show up while the turn still runs.
    _metadata(page, {"delay_ms": 120})
    _send(page, "tell me a story about a lighthouse keeper and a very patient cat")
    page.wait_for_function(
        """() => {
            const bubbles = document.querySelectorAll('[data-testid=assistant]');
            const last = bubbles[bubbles.length - 1];
            return last && last.textContent.length > 0
                && !document.getElementById('cancel').disabled;
        }"""
    )
    expect(page.get_by_test_id("status")).to_have_text(DONE, timeout=TIMEOUT_MS)

    _metadata(page, None)
    _send(page, "What is 12*(3+4)?")
    tool = page.get_by_test_id("tool-call").last
    expect(tool).to_contain_text("calculator")
    expect(tool).to_contain_text("→ 84")
    expect(page.get_by_test_id("assistant").last).to_contain_text("84")

    page.reload()
    expect(page.get_by_test_id("user")).to_have_count(2)
    expect(page.get_by_test_id("tool-call")).to_have_count(1)
    expect(page.get_by_test_id("assistant").last).to_contain_text("84")
    expect(page.get_by_test_id("session-item")).to_have_count(1)
    page.screenshot(path=str(tmp_path / "playground.png"), full_page=True)
    assert (tmp_path / "playground.png").stat().st_size > 10_000


def test_a_slow_turn_can_be_cancelled(page: Page) -> None:
    page.goto("/")
    page.get_by_test_id("new-session").click()
    _metadata(page, {"delay_ms": 400})
    _send(page, "one two three four five six seven eight nine ten eleven twelve")
    expect(page.get_by_test_id("cancel")).to_be_enabled()
    page.wait_for_function(
        "() => document.querySelector('[data-testid=assistant]')?.textContent.length > 0"
    )
    page.get_by_test_id("cancel").click()
    expect(page.get_by_test_id("status")).to_have_text("Cancelled")
    expect(page.get_by_test_id("error")).to_contain_text("cancel")
    # The cancelled turn left no trace in the history.
    page.reload()
    expect(page.get_by_test_id("user")).to_have_count(0)


def test_a_dropped_stream_resumes_without_losing_or_repeating_text(
    browser: Browser, shared_mesh: SharedMesh
) -> None:
    # Through a proxy whose connections the test cuts: the network dropping
    # the stream mid-turn, as the browser sees it.
    proxy = TcpProxy(shared_mesh.edge)
    context = browser.new_context(base_url=f"http://{proxy.address}")
    context.set_default_timeout(TIMEOUT_MS)
    try:
        page = context.new_page()
        page.goto("/")
        page.get_by_test_id("new-session").click()
        _metadata(page, {"delay_ms": 150})
        words = " ".join(f"w{n}" for n in range(30))
        _send(page, words)
        page.wait_for_function(
            "() => document.querySelector('[data-testid=assistant]')?.textContent.length > 20"
        )
        proxy.cut()
        expect(page.get_by_test_id("status")).to_contain_text("Resuming after event")
        expect(page.get_by_test_id("status")).to_have_text(DONE, timeout=TIMEOUT_MS)
        streamed = page.get_by_test_id("assistant").last.text_content()
        page.reload()
        expect(page.get_by_test_id("assistant")).to_have_count(1)
        assert page.get_by_test_id("assistant").last.text_content() == streamed
        assert streamed is not None and f'You said: "{words}"' in streamed
    finally:
        context.close()
        proxy.close()


def test_api_errors_are_shown_readably(page: Page) -> None:
    page.goto("/")
    page.get_by_test_id("new-session").click()
    _send(page, "x" * 10_001)
    error = page.get_by_test_id("error")
    expect(error).to_contain_text("Invalid request (400)")
    expect(error).to_contain_text("message: must be at most 10000 characters")


# --- CORS -----------------------------------------------------------------------

CALLER = """<!doctype html><title>caller</title><pre id=out>pending</pre><script>
fetch("{api}/v1/sessions", {{method: "POST", headers: {{"content-type": "application/json"}},
                            body: "{{}}"}})
  .then(r => r.json().then(b => document.getElementById("out").textContent =
        "ok " + r.status + " " + r.headers.get("x-session-id") + " " + b.session.sessionId))
  .catch(e => document.getElementById("out").textContent = "refused " + e.message);
</script>"""


@pytest.fixture
def origin_site(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A page server on a second local port: another origin than the API's."""
    handler = partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", tmp_path
    finally:
        server.shutdown()
        server.server_close()


def test_another_origin_may_call_the_api_only_when_allowed(
    browser: Browser, mesh_factory: Mesh, origin_site: tuple[str, Path]
) -> None:
    origin, site = origin_site
    mesh = mesh_factory
    mesh.start_router()
    worker = mesh.spawn_worker("worker", "demo")
    server = mesh.spawn_server("server")
    mesh.wait_ready(worker, server)
    allowed = mesh.start_envoy([server], "allowed-edge", cors_origins=(origin,))
    default = mesh.start_envoy([server], "default-edge")
    for name, edge in (("allowed", allowed), ("default", default)):
        (site / f"{name}.html").write_text(CALLER.format(api=f"http://{edge.listener_address}"))
    context = browser.new_context()
    try:
        tab = context.new_page()
        tab.goto(f"{origin}/allowed.html")
        expect(tab.locator("#out")).to_contain_text("ok 200", timeout=TIMEOUT_MS)
        tab.goto(f"{origin}/default.html")
        # The default allows http://localhost:3000 only: the browser refuses.
        expect(tab.locator("#out")).to_contain_text("refused", timeout=TIMEOUT_MS)
    finally:
        context.close()
    # Envoy itself answers the preflight for an allowed origin, naming what a
    # streaming client may read.
    preflight = httpx.options(
        f"http://{allowed.listener_address}/v1/sessions",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type, authorization"},
    )  # fmt: skip
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == origin
    assert "x-session-id" in preflight.headers["access-control-expose-headers"]
    refused = httpx.options(
        f"http://{default.listener_address}/v1/sessions",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in refused.headers
