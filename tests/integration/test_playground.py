"""The playground at GET /, in a real browser (Debian's Chromium, driven by
Playwright): conversations, and the session list, which is the API's
(GET /v1/sessions, the key's principal's own, paged); and CORS for pages on
other origins."""

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
from tests.support.mesh import Component, Mesh
from tests.support.tcp_proxy import TcpProxy

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TIMEOUT_MS = 30_000
DONE = re.compile(r"^Done: \d+ tokens$")
MESH_KEY = "tm-playground-mesh-key-0123456789"
KEYS = {"alice": "key-a", "bob": "key-b"}
PAGE_SIZE = 20  # the playground's


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
    # The list (the API's) marks this session, its line counting the messages.
    current = page.get_by_test_id("session-id").text_content()
    active = page.locator("[data-testid=session-item].active")
    expect(active).to_have_count(1)
    expect(active).to_have_attribute("data-session-id", current or "")
    expect(active).to_contain_text(re.compile(r"\d+ messages"))
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


# --- The session list ---------------------------------------------------------


@pytest.fixture
def plain_api(shared_mesh: SharedMesh) -> Iterator[httpx.Client]:
    """The shared mesh's REST API (no keys: every session there is the
    anonymous principal's)."""
    with httpx.Client(base_url=f"http://{shared_mesh.edge}", timeout=30) as client:
        yield client


def _create(rest: httpx.Client, key: str | None = None) -> str:
    """A session made through the REST API, not the page; its id."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = rest.post("/v1/sessions", json={}, headers=headers)
    assert response.status_code == 200, response.text
    return str(response.json()["session"]["sessionId"])


def _api_listing(rest: httpx.Client, key: str) -> list[str]:
    """Every session id the API lists for this key, newest first."""
    ids: list[str] = []
    token = ""
    while True:
        response = rest.get(
            "/v1/sessions",
            params={"pageSize": "100", **({"pageToken": token} if token else {})},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert response.status_code == 200, response.text
        ids += [s["sessionId"] for s in response.json().get("sessions", [])]
        token = response.json().get("nextPageToken", "")
        if not token:
            return ids


def _expect_listed(page: Page, ids: list[str], *, exactly: bool = False) -> None:
    """The page's list starts with these ids, in this order (and has no more)."""
    items = page.get_by_test_id("session-item")
    if exactly:
        expect(items).to_have_count(len(ids))
    for n, sid in enumerate(ids):
        expect(items.nth(n)).to_have_attribute("data-session-id", sid)


def _listed(page: Page) -> list[str]:
    ids = page.get_by_test_id("session-item").evaluate_all(
        "items => items.map((item) => item.dataset.sessionId)"
    )
    return [str(sid) for sid in ids]


def _use_key(page: Page, key: str) -> None:
    if not page.locator("aside details").evaluate("details => details.open"):
        page.locator("details summary").click()
    page.locator("#api-key").fill(key)
    page.locator("#api-key").press("Enter")  # commits it (a change event)


def test_the_session_list_is_the_apis_newest_first(page: Page, plain_api: httpx.Client) -> None:
    rest = plain_api
    older, newer = _create(rest), _create(rest)
    page.goto("/")
    _expect_listed(page, [newer, older])

    # Made elsewhere while the page is open: on top after a reload.
    newest = _create(rest)
    page.reload()
    _expect_listed(page, [newest, newer, older])

    # Open when deleted elsewhere: after a reload neither listed nor open.
    page.locator(f"[data-session-id='{newest}']").click()
    expect(page.get_by_test_id("session-id")).to_have_text(newest)
    expect(page.locator("[data-testid=session-item].active")).to_have_text(re.compile(newest))
    assert rest.delete(f"/v1/sessions/{newest}").json() == {"deleted": True}
    page.reload()
    page.wait_for_function("() => localStorage.getItem('turnmesh.current') === null")
    _expect_listed(page, [newer, older])
    expect(page.get_by_test_id("session-id")).to_have_text("none")
    expect(page.get_by_test_id("error")).to_have_count(0)

    # Nothing of it is kept in the browser: with localStorage cleared, the same list.
    page.evaluate("localStorage.clear()")
    page.reload()
    _expect_listed(page, [newer, older])

    # Made and deleted through the page: the list follows.
    page.get_by_test_id("new-session").click()
    expect(page.get_by_test_id("session-id")).not_to_have_text("none")
    made = page.get_by_test_id("session-id").text_content() or ""
    _expect_listed(page, [made, newer, older])
    expect(page.locator("[data-testid=session-item].active")).to_have_attribute(
        "data-session-id", made
    )
    page.locator("details summary").click()
    page.locator("#delete-session").click()
    _expect_listed(page, [newer, older])
    expect(page.get_by_test_id("session-id")).to_have_text("none")
    assert page.evaluate("Object.keys(localStorage)") == []

    # A listing that fails says why (the problem's detail), and lists nothing.
    problem = {"title": "Unavailable", "status": 503, "detail": "the store is away"}
    page.route(
        re.compile(r"/v1/sessions\?"),
        lambda route: route.fulfill(
            status=503, content_type="application/problem+json", body=json.dumps(problem)
        ),
    )
    page.reload()
    expect(page.get_by_test_id("sessions-status")).to_have_text(
        "Could not list sessions: Unavailable (503): the store is away"
    )
    expect(page.get_by_test_id("session-item")).to_have_count(0)


@pytest.fixture(scope="module")
def keyed_edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A mesh with API keys (alice's and bob's): its Envoy listener."""
    workdir = tmp_path_factory.mktemp("playground-keys")
    keys = workdir / "api-keys"
    keys.write_text("".join(f"{name}\t{key}\n" for name, key in KEYS.items()))
    mesh = Mesh(workdir / "mesh", common_args=("--mesh-key", MESH_KEY))
    try:
        mesh.start_router()
        servers: list[Component] = [
            mesh.spawn_server("server", "--api-keys-file", str(keys), "--agent", "echo")
        ]
        mesh.wait_ready(mesh.spawn_worker("worker-echo", "echo"), *servers)
        yield mesh.start_envoy(servers).listener_address
    finally:
        mesh.stop()


@pytest.fixture
def keyed_api(keyed_edge: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{keyed_edge}", timeout=30) as client:
        yield client


@pytest.fixture
def keyed_page(browser: Browser, keyed_edge: str) -> Iterator[Page]:
    context = browser.new_context(base_url=f"http://{keyed_edge}")
    context.set_default_timeout(TIMEOUT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


def test_each_key_lists_its_principals_sessions_only(
    keyed_page: Page, keyed_api: httpx.Client
) -> None:
    page, rest = keyed_page, keyed_api
    alices = [_create(rest, KEYS["alice"]) for _ in range(2)]
    bobs = [_create(rest, KEYS["bob"]) for _ in range(2)]

    # No key: a message asking for one, no list, a page that still works.
    page.goto("/")
    expect(page.get_by_test_id("sessions-status")).to_contain_text("needs an API key")
    expect(page.get_by_test_id("session-item")).to_have_count(0)
    page.get_by_test_id("new-session").click()
    expect(page.get_by_test_id("error")).to_contain_text("(401)")

    _use_key(page, KEYS["alice"])
    _expect_listed(page, alices[::-1])
    assert _listed(page) == _api_listing(rest, KEYS["alice"])[:PAGE_SIZE]
    # A session made through the page is alice's too.
    page.get_by_test_id("new-session").click()
    expect(page.get_by_test_id("session-id")).not_to_have_text("none")
    made = page.get_by_test_id("session-id").text_content() or ""
    _expect_listed(page, [made, *alices[::-1]])
    assert made in _api_listing(rest, KEYS["alice"])

    # Bob's key: bob's list, nothing of alice's, her session closed.
    _use_key(page, KEYS["bob"])
    _expect_listed(page, bobs[::-1])
    expect(page.get_by_test_id("session-id")).to_have_text("none")
    assert _listed(page) == _api_listing(rest, KEYS["bob"])[:PAGE_SIZE]
    assert not set(_listed(page)) & {made, *alices}
    page.reload()  # the key is kept; the list is asked for again
    _expect_listed(page, bobs[::-1])

    _use_key(page, "not-a-key")
    expect(page.get_by_test_id("sessions-status")).to_contain_text("not accepted")
    expect(page.get_by_test_id("session-item")).to_have_count(0)


def test_more_loads_the_next_page_of_sessions(keyed_page: Page, keyed_api: httpx.Client) -> None:
    for _ in range(PAGE_SIZE + 3):
        _create(keyed_api, KEYS["bob"])
    listed = _api_listing(keyed_api, KEYS["bob"])
    page = keyed_page
    page.goto("/")
    _use_key(page, KEYS["bob"])
    more = page.get_by_test_id("more-sessions")
    shown = PAGE_SIZE
    _expect_listed(page, listed[:shown], exactly=True)
    while shown < len(listed):
        more.click()
        shown = min(len(listed), shown + PAGE_SIZE)
        _expect_listed(page, listed[:shown], exactly=True)
    expect(more).to_be_hidden()


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
