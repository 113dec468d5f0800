"""The fault-injecting stub itself: process mode (full and fast), time-window faults, and a
kill that really drops open connections."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import anyio
import pytest

from batchclient import RemoteBatchInference
from batchclient.testing import Fault, StubProcess, StubReply, StubServer


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    request = urllib.request.Request(
        f"{url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}"), dict(err.headers)


MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "hi there"}]
BODY: dict[str, Any] = {"model": "smollm2", "messages": MESSAGES}


@pytest.mark.slow
@pytest.mark.parametrize("mode", [(), ("--fast",)])
def test_process_mode_answers_and_counts(mode: tuple[str, ...]) -> None:
    with StubProcess(*mode) as stub:
        status, body, _ = post(stub.url, BODY)
        assert status == 200
        assert body["choices"][0]["message"]["content"] == "echo: hi there"
        assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
        status, _, _ = post(stub.url, {**BODY, "model": "other"})
        assert status == 404
        stats = stub.stats()
    assert stats["requests"] == 2 and stats["by_status"] == {"200": 1, "404": 1}


@pytest.mark.slow
@pytest.mark.parametrize("mode", [(), ("--fast",)])
async def test_process_mode_capacity_answers_429_with_retry_after(mode: tuple[str, ...]) -> None:
    # The two admitted requests hold their slots for 5 s, so all four arrive while both are
    # taken however slowly the threads start; the refused two are answered at once.
    args = (*mode, "--latency", "5", "--capacity", "2", "--capacity-retry-after", "7")
    with StubProcess(*args) as stub:
        async with anyio.create_task_group() as tg:
            results: list[tuple[int, dict[str, str]]] = []

            async def one() -> None:
                status, _, headers = await anyio.to_thread.run_sync(post, stub.url, BODY)
                results.append((status, headers))

            for _ in range(4):
                tg.start_soon(one)
        stats = stub.stats()
    throttled = [h for s, h in results if s == 429]
    assert sorted(s for s, _ in results) == [200, 200, 429, 429]
    assert all(h.get("Retry-After") == "7" for h in throttled)
    assert stats["by_status"] == {"200": 2, "429": 2}


@pytest.mark.slow
def test_process_mode_5xx_burst_over_a_time_window() -> None:
    # A wide window, waited out from when the stub was ready (its clock starts before that).
    with StubProcess("--burst", "503:0:3:1") as stub:
        ready = time.monotonic()
        status, _, headers = post(stub.url, BODY)
        assert (status, headers.get("Retry-After")) == (503, "1")
        time.sleep(max(0.0, ready + 3.1 - time.monotonic()))
        status, _, _ = post(stub.url, BODY)
        assert status == 200


@pytest.mark.slow
async def test_killing_a_stub_process_resets_its_connections_mid_request() -> None:
    box = {}
    with StubProcess("--latency", "20") as stub:
        client = RemoteBatchInference(stub.url, max_retries=0, check_model=False)
        async with client, anyio.create_task_group() as tg:

            async def run() -> None:
                box["r"] = await client.batch_chat_completion("smollm2", [BODY["messages"]])

            tg.start_soon(run)
            await anyio.sleep(0.5)
            started = time.monotonic()
            stub.kill()
        waited = time.monotonic() - started
    err = box["r"].batch[0].error
    assert err is not None and err.code == "connection_error"
    assert waited < 5.0  # the reset arrives at once, not after the 20 s answer


async def test_thread_stub_kill_drops_open_connections_at_once() -> None:
    stub = StubServer(latency_s=20.0).start()
    async with RemoteBatchInference(stub.url, max_retries=0) as client:
        async with anyio.create_task_group() as tg:
            box = {}

            async def run() -> None:
                box["r"] = await client.batch_chat_completion("smollm2", [BODY["messages"]] * 3)

            tg.start_soon(run)
            await anyio.sleep(0.3)
            started = time.monotonic()
            await anyio.to_thread.run_sync(stub.kill)
        waited = time.monotonic() - started
    assert waited < 5.0  # not after the 20 s answer
    assert {r.error.code for r in box["r"].batch if r.error} == {"connection_error"}
    assert all(r.error is not None for r in box["r"].batch)


async def test_time_window_fault_rules() -> None:
    # The window is wide and the wait measured from when the stub was up, so a machine busy
    # with other work neither pushes the first request out of the window nor the second into it.
    with StubServer(faults=[Fault(StubReply(status=500), after_s=0.0, until_s=2.0)]) as stub:
        up = time.monotonic()  # the stub's clock started before this
        async with RemoteBatchInference(stub.url, max_retries=0) as client:
            first = await client.batch_chat_completion("smollm2", [BODY["messages"]])
            await anyio.sleep(max(0.0, up + 2.05 - time.monotonic()))
            later = await client.batch_chat_completion("smollm2", [BODY["messages"]])
    assert first.batch[0].error is not None and first.batch[0].error.status_code == 500
    assert later.batch[0].error is None
