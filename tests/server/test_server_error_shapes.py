"""Errors as real clients see them on the ``/batch-inference`` routes: the field named as the
client wrote it (no pydantic type names, tagged-union labels or links), ``param`` set where the
``/v1`` routes set it, a 409 in HTTP terms; and one cancel rule on every face (cancelling a
cancelled batch answers it, cancelling a completed one is 409)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest

from batchclient import BatchClient
from batchclient.cli import main
from batchclient.errors import JobStateError
from batchclient.remote import RemoteProvider
from batchclient.testing import Fault, StubReply, StubServer
from server_util import batch_file, http, is_envelope, sdk, served, wait_batch

MESSAGES = [[{"role": "user", "content": "hi"}]]
INTERNALS = ("SamplingParams", "tagged-union", "pydantic", "list[", "job_wait", "LogProbConfig")


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shapes") / "state"


@pytest.fixture(scope="module")
def url(state: Path) -> Iterator[str]:
    """One server for the module (each test makes its own files and batches)."""
    with (
        StubServer(faults=[Fault(StubReply(delay_s=30), match="SLOW")]) as stub,
        served(stub.url, state) as base,
    ):
        yield base


def clean(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = is_envelope(response)
    assert not any(word in error["message"] for word in INTERNALS), error
    assert not any(word in str(error["param"]) for word in INTERNALS), error
    return error


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"sampling_params": {"max_tokens": "x"}}, "sampling_params.max_tokens"),
        ({"sampling_params": {"strategy": {"type": "bogus"}}}, "sampling_params.strategy"),
        ({"sampling_params": [{"max_tokens": -1}]}, "sampling_params.0.max_tokens"),
        ({"response_format": {"type": "nope"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"logprobs": {"top_k": "a"}}, "logprobs.top_k"),
        ({"tool_choice": 5}, "tool_choice"),
        # whole-call argument errors found after validation: named too
        ({"sampling_params": [{}, {}]}, "sampling_params"),
        ({"tool_choice": "no_such_tool"}, "tool_choice"),
        ({"custom_ids": ["a", "b"]}, "custom_ids"),
    ],
)
def test_chat_completion_names_the_field_as_sent(
    url: str, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "smollm2", "messages_batch": MESSAGES, **extra}
    with http(url, None) as client:
        error = clean(client.post("/batch-inference/chat-completion", json=body))
    assert error["param"] == param and error["message"].startswith(param), error
    with pytest.raises(openai.BadRequestError) as caught:  # the SDK reads the same envelope
        sdk(url, None).post("/../batch-inference/chat-completion", body=body, cast_to=object)
    assert caught.value.param == param


def test_a_bad_conversation_is_its_items_error_in_plain_words(url: str) -> None:
    body = {"model": "smollm2", "messages_batch": [[{"role": "nobody", "content": 1}], *MESSAGES]}
    with http(url, None) as client:
        response = client.post("/batch-inference/chat-completion", json=body)
    assert response.status_code == 200
    bad, good = response.json()["batch"]
    assert bad["error"]["code"] == "invalid_request" and good["error"] is None
    assert "pydantic" not in bad["error"]["message"] and "https://" not in bad["error"]["message"]


def test_jobs_route_names_the_field_where_v1_batches_does(url: str) -> None:
    client = sdk(url, None)
    usable = client.files.create(file=("x.jsonl", batch_file(1)), purpose="batch")
    cases: list[tuple[dict[str, Any], dict[str, Any], str]] = [  # jobs body, /v1 body, param
        ({"file_id": usable.id, "completion_window": "soon"},
         {"input_file_id": usable.id, "completion_window": "soon"}, "completion_window"),
        ({"file_id": usable.id, "metadata": {"k" * 65: "v"}},
         {"input_file_id": usable.id, "metadata": {"k" * 65: "v"}}, "metadata"),
    ]  # fmt: skip
    with http(url, None) as raw:
        for jobs_body, v1_body, param in cases:
            ours = clean(raw.post("/batch-inference/jobs", json=jobs_body))
            v1 = clean(
                raw.post("/v1/batches", json={**v1_body, "endpoint": "/v1/chat/completions"})
            )
            assert ours["param"] == param, ours
            assert v1["param"] == param, v1


def test_an_unfinished_result_is_a_409_in_http_terms(url: str) -> None:
    client = sdk(url, None)
    upload = client.files.create(file=("in.jsonl", batch_file(2, "SLOW")), purpose="batch")
    with http(url, None) as raw:
        job = raw.post("/batch-inference/jobs", json={"file_id": upload.id}).json()["job_id"]
        error = clean(raw.get(f"/batch-inference/jobs/{job}/result"), 409)
        assert error["param"] == "job_id" and f"GET /batch-inference/jobs/{job}" in error["message"]
        assert raw.delete(f"/batch-inference/jobs/{job}").status_code == 200


def test_one_cancel_rule_on_every_face(url: str, state: Path) -> None:
    """Cancelling a cancelled batch answers it (a retried cancel is safe); cancelling a
    completed one is 409 ``conflict``: /v1/batches, /batch-inference, Python and the CLI."""
    client = sdk(url, None)
    slow = client.files.create(file=("in.jsonl", batch_file(2, "SLOW")), purpose="batch")
    fast = client.files.create(file=("in.jsonl", batch_file(2)), purpose="batch")

    def start(file_id: str) -> str:
        batch = client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        return batch.id

    cancelled, completed = start(slow.id), start(fast.id)
    assert client.batches.cancel(cancelled).status == "cancelled"
    assert wait_batch(client, completed).status == "completed"
    assert client.batches.cancel(cancelled).status == "cancelled"  # the SDK, again: 200
    with pytest.raises(openai.ConflictError) as caught:
        client.batches.cancel(completed)
    assert caught.value.code == "conflict"
    with http(url, None) as raw:
        assert raw.delete(f"/batch-inference/jobs/{cancelled}").json() is None
        clean(raw.delete(f"/batch-inference/jobs/{completed}"), 409)
        clean(raw.post(f"/v1/batches/{completed}/cancel"), 409)

    async def python() -> None:
        async with BatchClient(RemoteProvider("http://127.0.0.1:9/v1"), state_dir=state) as c:
            await c.job_cancel(cancelled)
            assert (await c.batches.cancel(cancelled)).status == "cancelled"
            with pytest.raises(JobStateError, match="completed"):
                await c.job_cancel(completed)

    anyio.run(python)
    assert main(["jobs", "cancel", cancelled, "--state-dir", str(state)]) == 0
    assert main(["jobs", "cancel", completed, "--state-dir", str(state)]) != 0
