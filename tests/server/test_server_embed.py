"""``create_app`` inside other code: over a client that is already open (served as it is, left
open), mounted in another ASGI application (its lifespan entered by the parent's), and over a
provider of one's own whose bugs become 500s in OpenAI's envelope."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import openai
import pytest
from fastapi import FastAPI

from batchclient import BatchClient, Provider, Request, Result
from batchclient.remote import RemoteProvider
from batchclient.server import create_app
from batchclient.testing import AppServer, StubServer
from server_util import KEY_A, batch_file


async def test_an_open_client_is_served_as_it_is_and_left_open(
    stub: StubServer, tmp_path: Path
) -> None:
    async with BatchClient(RemoteProvider(stub.url), state_dir=tmp_path) as client:
        mine = await client.files.create(batch_file(2), filename="mine.jsonl")
        async with AppServer(create_app(client)) as url:
            sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            assert [f.id async for f in sdk.files.list()] == [mine.id]  # one tenant: the client
            batch = await sdk.batches.create(
                input_file_id=mine.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            done = await client.batches.wait(batch.id)  # the app's batch is the client's
            await sdk.close()
        assert client.is_open and done.request_counts.completed == 2
        assert (await client.batches.retrieve(batch.id)).status == "completed"


async def test_mounted_in_another_app(stub: StubServer, tmp_path: Path) -> None:
    api = create_app(RemoteProvider(stub.url), state_dir=tmp_path, api_keys=[KEY_A])

    @asynccontextmanager
    async def lifespan(parent: FastAPI) -> AsyncIterator[None]:
        async with api.router.lifespan_context(api):  # mounted apps' lifespans do not run
            yield

    parent = FastAPI(lifespan=lifespan)

    @parent.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    parent.mount("/batch", api)
    async with AppServer(parent) as url:
        sdk = openai.AsyncOpenAI(base_url=f"{url}/batch/v1", api_key=KEY_A, max_retries=0)
        assert [m.id for m in (await sdk.models.list()).data] == ["smollm2"]
        record = await sdk.files.create(file=("in.jsonl", batch_file(1)), purpose="batch")
        assert (await sdk.files.retrieve(record.id)).bytes == record.bytes
        await sdk.close()
        async with httpx.AsyncClient(base_url=url) as plain:
            assert (await plain.get("/health")).json() == {"status": "ok"}
            assert (await plain.get("/batch/v1/files")).status_code == 401


class Flaky(Provider):
    """A provider of one's own with bugs: ``execute`` raises on "boom", ``models`` always."""

    async def execute(self, request: Request) -> Result:
        text = request.body["messages"][-1]["content"]
        if text == "boom":
            raise RuntimeError("a bug in the provider")
        return Result(status_code=200, body={
            "id": f"echo-{request.index}", "object": "chat.completion", "created": 0,
            "model": "echo", "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": text}}],
        })  # fmt: skip

    async def models(self) -> list[str]:
        raise RuntimeError("cannot list")


async def test_any_provider_and_its_bugs_are_500_envelopes(tmp_path: Path) -> None:
    async with AppServer(create_app(Flaky(), state_dir=tmp_path)) as url:
        sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        answer = await sdk.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content == "hi"
        with pytest.raises(openai.InternalServerError) as bug:
            await sdk.chat.completions.create(
                model="echo", messages=[{"role": "user", "content": "boom"}]
            )
        assert bug.value.code == "internal_error" and "a bug in the provider" in bug.value.message
        async with httpx.AsyncClient(base_url=url) as plain:
            listed = await plain.get("/v1/models")
        assert listed.status_code == 500 and "Traceback" not in listed.text
        assert listed.json()["error"]["code"] == "internal_error"
        data = b"".join(
            json.dumps({"custom_id": t, "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": "echo", "messages": [{"role": "user", "content": t}]}}
                       ).encode() + b"\n" for t in ("hi", "boom")
        )  # fmt: skip
        upload = await sdk.files.create(file=("in.jsonl", data), purpose="batch")
        batch = await sdk.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        with anyio.fail_after(30):
            while (batch := await sdk.batches.retrieve(batch.id)).status != "completed":
                await anyio.sleep(0.05)
        assert batch.error_file_id is not None
        (error,) = (await sdk.files.content(batch.error_file_id)).text.splitlines()
        assert json.loads(error)["error"]["code"] == "internal_error"
        await sdk.close()
