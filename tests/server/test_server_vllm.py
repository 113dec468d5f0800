"""``batchclient serve`` over the real vLLM OpenAI server (remote provider) and over the real
in-process engine (inline provider), driven by the openai SDK; and the SIGKILL test of the
server in a subprocess with a counting proxy in front of the real vLLM server."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import anyio
import httpx
import openai
import pytest

from batchclient import BatchChatCompletionResponse, VLLMBatchInference
from batchclient.remote import RemoteProvider
from batchclient.server import create_app, tenant_id
from batchclient.testing import AppServer, CountingProxy, free_port
from jobs_util import done_in_db, jsonl, line, wait_sync
from server_util import KEY_A, ready, sdk, spawn, wait_batch

HUGE = " ".join(["word"] * 5000)  # over the 2048-token context


@pytest.mark.server
def test_the_sdk_against_the_real_vllm_server(vllm_url: str, tmp_path: Path) -> None:
    app = create_app(RemoteProvider(vllm_url, max_concurrency=8), state_dir=tmp_path,
                     api_keys=[KEY_A])  # fmt: skip
    with AppServer(app) as url:
        client = sdk(url)
        assert [m.id for m in client.models.list()] == ["smollm2"]
        answer = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
        )
        assert answer.choices[0].message.content and answer.usage is not None
        assert answer.usage.completion_tokens >= 1
        with pytest.raises(openai.BadRequestError):  # vLLM's own refusal, passed through
            client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": HUGE}], max_tokens=8
            )
        lines = [line("a", "Name a colour."), line("huge", HUGE), line("c", "Name a fruit.")]
        upload = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait_batch(client, batch.id, within=300)
        output = [
            json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()
        ]
        (error,) = [
            json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()
        ]
    assert done.request_counts.model_dump() == {"total": 3, "completed": 2, "failed": 1}
    assert [o["custom_id"] for o in output] == ["a", "c"]
    assert error["custom_id"] == "huge" and error["response"]["status_code"] == 400


@pytest.mark.server
def test_a_batch_survives_sigkill_against_the_real_vllm_server(
    vllm_url: str, tmp_path: Path
) -> None:
    """300 lines, the server SIGKILLed after about 100 answers, started again: every custom_id
    once, and what vLLM received twice is at most the in-flight window (counted by a proxy)."""
    window = 16
    state, port = tmp_path / "state", free_port()
    url = f"http://127.0.0.1:{port}"
    with CountingProxy(vllm_url) as proxy:
        proc = spawn(proxy.url, state, port, "--max-concurrency", str(window))
        try:
            ready(url, proc)
            client = sdk(url)
            data = jsonl([line(f"r{i}", f"Count to {i}.", max_tokens=4) for i in range(300)])
            upload = client.files.create(file=("in.jsonl", data), purpose="batch")
            batch = client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            wait_sync(lambda: proxy.requests >= 100 + window, timeout=240, every=0.002)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            at_kill = done_in_db(state / "tenants" / tenant_id(KEY_A))
            sent_before = proxy.requests
            proc = spawn(proxy.url, state, port, "--max-concurrency", str(window))
            ready(url, proc)
            done = wait_batch(client, batch.id, within=400)
            ids = [json.loads(x)["custom_id"] for x in
                   client.files.content(done.output_file_id).text.splitlines()]  # fmt: skip
        finally:
            proc.kill()
            proc.wait()
    assert 100 <= at_kill < 300 and sent_before - at_kill <= window
    assert sorted(ids) == sorted(f"r{i}" for i in range(300))
    assert len(proxy.bodies) == 300 and proxy.resent <= window


@pytest.mark.engine
async def test_the_sdk_over_the_inline_engine(
    inline_client: VLLMBatchInference, tmp_path: Path
) -> None:
    app = create_app(inline_client, state_dir=tmp_path, api_keys=[KEY_A])  # the engine stays open
    async with AppServer(app) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY_A, max_retries=0)
        assert [m.id for m in (await client.models.list()).data] == ["smollm2"]
        lines = jsonl([line("a", "Say yes."), line("huge", HUGE), line("c", "Say no.")])
        upload = await client.files.create(file=("in.jsonl", lines), purpose="batch")
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        with anyio.fail_after(300):
            while (batch := await client.batches.retrieve(batch.id)).status != "completed":
                assert batch.status in ("validating", "in_progress", "finalizing")
                await anyio.sleep(0.1)
        assert batch.error_file_id is not None
        error = json.loads((await client.files.content(batch.error_file_id)).text)
        async with httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=120
        ) as plain:
            sync = await plain.post(
                "/batch-inference/chat-completion",
                json={"model": "smollm2", "sampling_params": {"max_tokens": 8},
                      "messages_batch": [[{"role": "user", "content": "Hi"}]] * 2},
            )  # fmt: skip
        await client.close()
    assert batch.request_counts is not None
    assert batch.request_counts.model_dump() == {"total": 3, "completed": 2, "failed": 1}
    assert error["custom_id"] == "huge" and error["response"]["status_code"] == 400
    result = BatchChatCompletionResponse.model_validate(sync.json())
    assert len(result.batch) == 2 and all(item.text for item in result.batch)
    assert inline_client.is_open
