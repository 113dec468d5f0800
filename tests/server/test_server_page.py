"""The status page at ``/``: its sign-in (a cookie holding a server-side session token, never
the key), what it shows (each batch's progress, counts, throughput, ETA, first failed lines),
that tenant input is escaped, and a real headless Chromium rendering it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from batchclient.remote import RemoteProvider
from batchclient.server import _page, _page_render, create_app
from batchclient.testing import AppServer, Fault, StubReply, StubServer
from chromium_util import CHROMIUM, SKIP_REASON, Chromium
from jobs_util import jsonl, line
from server_util import KEY_A, KEY_B, batch_file, is_envelope, sdk, wait_batch

HOSTILE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
BAD_ANSWER = {"error": {"message": "bad <b>request</b> " + HOSTILE, "type": "invalid_request"}}


def _stub() -> StubServer:
    return StubServer(
        latency_s=0.02,
        faults=[Fault(StubReply(status=400, body=BAD_ANSWER), match="refuse me")],
    )


def _app(stub: StubServer, state: Path, keys: list[str]) -> Any:
    provider = RemoteProvider(stub.url, max_concurrency=2, adaptive=False, max_retries=0)
    return create_app(provider, state_dir=state, api_keys=keys)


def _finished_batch(url: str, key: str | None) -> str:
    """A batch of three lines, one refused upstream, with hostile metadata and custom_id."""
    client = sdk(url, key)
    lines = [line("ok-1", "hello"), line("<i>odd</i>", "refuse me"), line("ok-2", "again")]
    file = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"note": HOSTILE, "priority": "high"},
    )
    done = wait_batch(client, batch.id)
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    return batch.id


def _running_batch(url: str, key: str) -> str:
    client = sdk(url, key)
    file = client.files.create(file=("big.jsonl", batch_file(200, "slow")), purpose="batch")
    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 60
    while True:
        got = client.batches.retrieve(batch.id)
        counts = got.request_counts
        if got.status == "in_progress" and counts is not None and counts.completed > 4:
            return batch.id
        assert time.monotonic() < deadline, got
        time.sleep(0.02)


def test_without_keys_the_page_shows_the_batches_escaped_and_needs_no_sign_in(
    tmp_path: Path,
) -> None:
    with _stub() as stub, AppServer(_app(stub, tmp_path, [])) as url:
        batch_id = _finished_batch(url, None)
        page = httpx.get(f"{url}/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == "no-store"
    assert "script-src" not in page.headers["content-security-policy"]  # default-src 'none'
    html = page.text
    assert batch_id in html and 'name="key"' not in html
    assert "<script" not in html and "<img" not in html and "<i>odd" not in html
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in html
    assert "&lt;i&gt;odd&lt;/i&gt;" in html  # the failed line, escaped
    assert "2 / 1 / 3" in html


def test_the_page_names_no_path_of_the_server(tmp_path: Path) -> None:
    """Error messages on the page are redacted as the API's are: the state directory is
    ``<state>``, any other absolute path ``<path>``."""
    state = tmp_path / "state"
    said = f"cannot write {state}/files/out.jsonl (see /etc/batchclient.conf)"
    refusal = {"error": {"message": said, "type": "invalid_request_error"}}
    stub = StubServer(faults=[Fault(StubReply(status=400, body=refusal), match="refuse me")])
    with stub, AppServer(_app(stub, state, [])) as url:
        client = sdk(url, None)
        lines = [line("ok", "hello"), line("refused", "refuse me")]
        file = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert wait_batch(client, batch.id).request_counts.failed == 1
        html = httpx.get(f"{url}/").text
    assert "cannot write &lt;state&gt;/files/out.jsonl (see &lt;path&gt;)" in html, html
    assert str(tmp_path) not in html and "/etc/" not in html


def test_one_tenants_sign_ins_never_sign_another_out() -> None:
    """Each tenant keeps its newest sessions: a tenant signing in over and over forgets only
    its own oldest (a shared cap let 10,050 sign-ins of one tenant drop every other's)."""
    sessions = _page.Sessions()
    b = sessions.open("b")
    a = [sessions.open("a") for _ in range(_page.MAX_SESSIONS_PER_TENANT + 50)]
    assert sessions.tenant(b) == "b"
    assert sessions.tenant(a[-1]) == "a" and sessions.tenant(a[0]) is None
    sessions.close(b)
    assert sessions.tenant(b) is None


def test_sign_in_attempts_are_limited_per_client_address(tmp_path: Path) -> None:
    """20 attempts a minute from one address, then 429 with Retry-After, even with the right
    key; another address still signs in."""
    with _stub() as stub, AppServer(_app(stub, tmp_path, [KEY_A])) as url:
        with httpx.Client(base_url=url) as browser:
            codes = [
                browser.post("/signin", data={"key": f"wrong-key-{i:011d}"}).status_code
                for i in range(_page.MAX_SIGNINS)
            ]
            refused = browser.post("/signin", data={"key": KEY_A})
        local = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=url, transport=local) as other:
            elsewhere = other.post("/signin", data={"key": KEY_A})
    assert codes == [401] * _page.MAX_SIGNINS
    assert refused.status_code == 429 and is_envelope(refused)["code"] == "rate_limit_exceeded"
    assert 0 < int(refused.headers["retry-after"]) <= 60
    assert elsewhere.status_code == 303


def test_with_keys_the_page_signs_in_with_a_session_cookie_that_opens_only_the_page(
    tmp_path: Path,
) -> None:
    with _stub() as stub, AppServer(_app(stub, tmp_path, [KEY_A, KEY_B])) as url:
        a_batch = _finished_batch(url, KEY_A)
        b_batch = _finished_batch(url, KEY_B)
        with httpx.Client(base_url=url) as browser:
            form = browser.get("/")
            assert form.status_code == 200 and 'name="key"' in form.text
            assert a_batch not in form.text
            wrong = browser.post("/signin", data={"key": "not-a-key-0123456789"})
            assert wrong.status_code == 401 and "not valid" in wrong.text
            assert "set-cookie" not in wrong.headers
            signed = browser.post("/signin", data={"key": KEY_A})
            assert signed.status_code == 303 and signed.headers["location"] == "/"
            cookie = signed.headers["set-cookie"]
            flags = {part.strip().lower() for part in cookie.split(";")}
            assert {"httponly", "samesite=strict", "path=/"} <= flags
            token = browser.cookies["batchclient_session"]
            assert KEY_A not in cookie and len(token) >= 40
            page = browser.get("/")
            assert a_batch in page.text and b_batch not in page.text
            assert "Sign out" in page.text
            api = browser.get("/v1/batches")  # the cookie is no API credential
            assert api.status_code == 401
            browser.post("/signout")
            assert 'name="key"' in httpx.get(f"{url}/", cookies={"batchclient_session": token}).text
        by_header = httpx.get(f"{url}/", headers={"Authorization": f"Bearer {KEY_B}"})
        assert b_batch in by_header.text and a_batch not in by_header.text


def test_a_sign_in_form_too_long_or_with_too_many_fields_is_a_400(tmp_path: Path) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    many = "&".join(f"f{i}=v" for i in range(20)) + f"&key={KEY_A}"
    with (
        _stub() as stub,
        AppServer(_app(stub, tmp_path, [KEY_A])) as url,
        httpx.Client(base_url=url) as browser,
    ):
        for body in (
            many.encode(),
            f"key={KEY_A}&pad=".encode() + b"p" * 5000,
            iter([f"key={KEY_A}&pad=".encode(), b"p" * 3000, b"p" * 3000]),  # chunked
        ):
            r = browser.post("/signin", content=body, headers=form)
            assert r.status_code == 400, r.text
            assert is_envelope(r)["type"] == "invalid_request_error"
            assert "set-cookie" not in r.headers
        signed = browser.post("/signin", data={"key": KEY_A})  # still signs in
        assert signed.status_code == 303 and "batchclient_session" in browser.cookies


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
async def test_the_status_page_in_headless_chromium(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_page_render, "REFRESH_S", 60)  # no reload while the test reads it
    with _stub() as stub, AppServer(_app(stub, tmp_path / "state", [KEY_A, KEY_B])) as url:
        finished = _finished_batch(url, KEY_A)
        _finished_batch(url, KEY_B)
        stub.latency_s = 1.0  # the batch runs for about half a minute: Chromium reads it live
        running = _running_batch(url, KEY_A)
        async with Chromium(tmp_path / "profile") as browser:
            await browser.navigate(f"{url}/")
            assert await browser.evaluate("!!document.querySelector('form#signin')")
            await browser.submit(
                f"document.querySelector('input[name=key]').value = {KEY_A!r};"
                "document.querySelector('form#signin').submit()"
            )
            state = await browser.evaluate(_READ_PAGE)
            cookies = await browser.cookies()
            shot = await browser.screenshot(tmp_path / "status_page.png")
        sdk(url, KEY_A).batches.cancel(running)
    assert state["href"] == f"{url}/"  # the key went in the body, not the URL
    assert state["scripts"] == 0 and state["images"] == 0 and state["pwned"] is None
    assert state["documentCookie"] == ""  # HttpOnly: no script can read it
    rows = {r["id"]: r for r in state["rows"]}
    assert set(rows) == {finished, running}  # tenant B's batch is not shown
    done = rows[finished]
    assert done["status"] == "completed"
    assert (done["value"], done["max"]) == (3, 3)
    assert done["counts"].startswith("2 / 1 / 3")
    assert done["metadata"] == '{"note": "' + HOSTILE.replace('"', '\\"') + '", "priority": "high"}'
    assert any(e.startswith("<i>odd</i>: ") and "<b>request</b>" in e for e in done["errors"])
    live = rows[running]
    assert live["status"] == "in_progress" and 0 < live["value"] < live["max"] == 200
    assert live["rate"].endswith("lines/s") and live["eta"].endswith(("s", "min"))
    assert state["capacity"].startswith("in flight ")
    (session,) = [c for c in cookies if c["name"] == "batchclient_session"]
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    assert KEY_A not in session["value"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000


_READ_PAGE = """(() => {
  const text = (row, sel) => (row.querySelector(sel) || {}).textContent || "";
  return {
    href: location.href,
    documentCookie: document.cookie,
    scripts: document.querySelectorAll("script").length,
    images: document.querySelectorAll("img").length,
    pwned: window.pwned === undefined ? null : window.pwned,
    capacity: text(document, "#capacity"),
    rows: [...document.querySelectorAll("tr.batch")].map(row => ({
      id: row.id,
      status: row.dataset.status,
      value: row.querySelector("progress").value,
      max: row.querySelector("progress").max,
      counts: text(row, ".counts"),
      rate: text(row, ".rate"),
      eta: text(row, ".eta"),
      metadata: text(row, ".metadata"),
      errors: [...document.querySelectorAll("tr.batch-errors")]
        .filter(tr => tr.dataset.batch === row.id)
        .flatMap(tr => [...tr.querySelectorAll("li")].map(li => li.textContent)),
    })),
  };
})()"""


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
async def test_at_420px_wide_the_page_reads_well_and_a_cancelled_batch_shows_what_was_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A phone-sized window: the tenant id on one or two lines (it wrapped a character per
    line), nothing wider than the window, each batch a block of labelled lines; a cancelled
    batch shows the lines it ran (it showed 100 % and a rate from its lines filled as not run)
    and, as every batch that is not running, no throughput or ETA."""
    monkeypatch.setattr(_page_render, "REFRESH_S", 60)
    with _stub() as stub, AppServer(_app(stub, tmp_path / "state", [KEY_A])) as url:
        finished = _finished_batch(url, KEY_A)
        stub.latency_s = 0.1
        cancelled = _running_batch(url, KEY_A)
        client = sdk(url, KEY_A)
        client.batches.cancel(cancelled)
        ended = wait_batch(client, cancelled)
        async with Chromium(tmp_path / "profile") as browser:
            await browser.send(
                "Emulation.setDeviceMetricsOverride",
                width=420,
                height=900,
                deviceScaleFactor=1,
                mobile=False,
            )
            await browser.navigate(f"{url}/")
            await browser.submit(
                f"document.querySelector('input[name=key]').value = {KEY_A!r};"
                "document.querySelector('form#signin').submit()"
            )
            page = await browser.evaluate(_READ_NARROW)
            shot = await browser.screenshot(tmp_path / "status_page_420.png")
    ran = ended.request_counts.completed
    assert ended.status == "cancelled" and 0 < ran < 200
    assert ended.request_counts.failed == 200 - ran  # the lines not run, filled as failed
    assert page["width"] == 420 and page["scrollWidth"] <= 420, page
    tenant = page["tenant"]
    assert tenant["text"].startswith("tenant ") and len(tenant["text"]) > 30
    assert tenant["height"] <= 2.2 * tenant["lineHeight"], tenant  # one or two lines
    assert not page["theadShown"]  # blocks of labelled lines, not a squeezed table
    rows = {r["id"]: r for r in page["rows"]}
    for row in rows.values():
        for cell in row["cells"]:
            assert cell["right"] <= 420 and cell["width"] >= 300, (row["id"], cell)
    gone = rows[cancelled]
    assert gone["status"] == "cancelled"
    assert gone["value"] == ran and gone["percent"] == f"{round(100 * ran / 200)}%"
    assert gone["counts"] == f"{ran} / 0 / 200, {200 - ran} not run (cancelled)"
    assert gone["rate"] == "\u2013" and gone["eta"] == "\u2013"
    assert rows[finished]["rate"] == "\u2013"  # finished: not running either
    assert gone["labels"] == ["Status", "Progress", "Completed / failed / total", "Throughput",
                              "ETA", "Tokens in (cached) / out", "Metadata"]  # fmt: skip
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000


_READ_NARROW = """(() => {
  const text = (row, sel) => (row.querySelector(sel) || {}).textContent || "";
  const tenant = document.querySelector("header .meta");
  return {
    width: window.innerWidth,
    scrollWidth: document.documentElement.scrollWidth,
    tenant: {
      text: tenant.textContent,
      height: tenant.getBoundingClientRect().height,
      lineHeight: parseFloat(getComputedStyle(tenant).lineHeight),
    },
    theadShown: getComputedStyle(document.querySelector("thead")).display !== "none",
    rows: [...document.querySelectorAll("tr.batch")].map(row => ({
      id: row.id,
      status: row.dataset.status,
      value: row.querySelector("progress").value,
      percent: text(row, ".percent"),
      counts: text(row, ".counts"),
      rate: text(row, ".rate"),
      eta: text(row, ".eta"),
      labels: [...row.querySelectorAll("td[data-label]")].map(td => td.dataset.label),
      cells: [...row.querySelectorAll("td")].map(td => {
        const r = td.getBoundingClientRect();
        return {width: r.width, right: r.right, text: td.textContent.slice(0, 40)};
      }),
    })),
  };
})()"""


def test_the_page_works_under_a_mount_prefix(tmp_path: Path) -> None:
    with _stub() as stub:
        api = _app(stub, tmp_path, [KEY_A])

        @asynccontextmanager
        async def lifespan(parent: FastAPI) -> AsyncIterator[None]:
            async with api.router.lifespan_context(api):
                yield

        parent = FastAPI(lifespan=lifespan)
        parent.mount("/batch", api)
        with AppServer(parent) as url, httpx.Client(base_url=url) as browser:
            batch_id = _finished_batch(f"{url}/batch", KEY_A)
            assert 'action="signin"' in browser.get("/batch/").text
            signed = browser.post("/batch/signin", data={"key": KEY_A}, follow_redirects=True)
            assert signed.url.path == "/batch/" and batch_id in signed.text
            assert "path=/batch/" in signed.history[0].headers["set-cookie"].lower()
