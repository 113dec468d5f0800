"""``output_expires_after``: a batch's output and error files expire a set time after the batch
was created (OpenAI's ``BatchCreateParams.output_expires_after``, anchor ``created_at``), on
``batchclient serve`` (through the openai SDK), on the library's own batches, and sent by
``BatchAPIBatchInference`` with each remote batch."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import openai
import pytest

from batchclient import BatchAPIBatchInference, RemoteBatchInference, SamplingParams
from batchclient.errors import FileNotFoundInStoreError
from batchclient.remote import RemoteProvider, RetryPolicy
from batchclient.server import create_app
from batchclient.testing import AppServer, StubServer
from server_util import KEY_A, batch_file, sdk, served, wait_batch

FAST = RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)


def test_serve_dates_the_output_files(tmp_path: Path) -> None:
    with StubServer() as stub, served(stub.url, tmp_path, api_keys=[KEY_A]) as url:
        client = sdk(url)
        upload = client.files.create(file=("in.jsonl", batch_file(3)), purpose="batch")
        expiry = {"anchor": "created_at", "seconds": 3600}
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
            output_expires_after=expiry,  # type: ignore[arg-type]
        )  # fmt: skip
        batch = wait_batch(client, batch.id)
        assert batch.output_file_id is not None
        output = client.files.retrieve(batch.output_file_id)
        assert output.expires_at == batch.created_at + 3600
        assert client.files.retrieve(upload.id).expires_at is None  # the input is the user's
        # OpenAI's bounds: one hour to 30 days
        with pytest.raises(openai.BadRequestError):
            client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions",
                completion_window="24h",
                output_expires_after={"anchor": "created_at", "seconds": 60},  # type: ignore[arg-type]
            )  # fmt: skip


async def test_an_expired_output_file_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with StubServer() as stub:
        async with RemoteBatchInference(stub.url, retry=FAST, state_dir=tmp_path) as client:
            record = await client.files.create(batch_file(2))
            batch = await client.batches.create(record.id, output_expires_after_s=3600)
            with anyio.fail_after(60):
                batch = await client.batches.wait(batch.id)
            assert batch.output_file_id is not None
            output = await client.files.retrieve(batch.output_file_id)
            assert output.expires_at == batch.created_at + 3600
            path = await client.files.path(batch.output_file_id)
            assert path.exists()
            # an hour and a second later
            later = int(time.time()) + 3601
            monkeypatch.setattr("batchclient.jobs._store.now", lambda: later)
            with pytest.raises(FileNotFoundInStoreError):
                await client.files.retrieve(batch.output_file_id)
            assert not path.exists()
            listed = [f.id for f in await client.files.list()]
            assert batch.output_file_id not in listed and record.id in listed


async def test_the_batch_api_client_sends_it_with_each_remote_batch(tmp_path: Path) -> None:
    with StubServer() as stub:
        provider = RemoteProvider(stub.url, max_retries=0, retry=FAST)
        app = create_app(provider, state_dir=tmp_path / "served")
        with AppServer(app) as url:
            async with BatchAPIBatchInference(
                f"{url}/v1", output_expires_after_s=7200, poll_interval_s=0.05, retry=FAST,
                state_dir=tmp_path / "client",
            ) as client:  # fmt: skip
                result = await client.batch_chat_completion(
                    "smollm2", [[{"role": "user", "content": "hi"}]], SamplingParams(max_tokens=4)
                )
            served_files = sdk(url, key=None).files.list(purpose="batch_output").data
    assert not result.errors
    assert served_files
    for f in served_files:
        # dated from the batch's creation, a moment before the file was written
        assert f.expires_at is not None and 7140 <= f.expires_at - f.created_at <= 7200
