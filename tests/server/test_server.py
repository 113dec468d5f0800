"""``batchclient.server`` on a real uvicorn server, driven by the real openai SDK (sync and
async, ``max_retries=0``), over the remote provider and a loopback stub: files, batches,
pagination, cancel, tenants, keys, idempotency, the one-request passthrough and the log."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types import Batch, FileDeleted, FileObject

from batchclient.testing import Fault, StubReply, StubServer
from jobs_util import jsonl, line, wait_sync
from server_util import (
    KEY_A,
    MULTIPART,
    Servers,
    batch_file,
    finished,
    http,
    is_envelope,
    multipart,
    sdk,
    served,
    shaped,
    wait_batch,
)

REFUSAL = {"error": {"message": "max_tokens is too large", "type": "BadRequestError",
                     "param": "max_tokens", "code": 400}}  # fmt: skip


pytestmark = pytest.mark.stub(
    faults=[
        Fault(StubReply(status=400, body=REFUSAL), match="FAIL"),
        Fault(StubReply(delay_s=30), match="SLOW"),
    ]
)


@pytest.fixture
def servers(stub: StubServer, tmp_path: Path) -> Iterator[Servers]:
    pool = Servers(stub.url, tmp_path)
    with pool.stack:
        yield pool


TENANT_KEYS = [f"tenant-key-{i:02d}-{'x' * 16}" for i in range(24)]
_unused_keys = iter(TENANT_KEYS)


@pytest.fixture(scope="module")
def shared(
    stub: StubServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """One server for the module, with many keys: each test takes tenants of its own."""
    state = tmp_path_factory.mktemp("shared")
    with served(stub.url, state, api_keys=TENANT_KEYS) as base:
        yield base, state


@pytest.fixture
def url(shared: tuple[str, Path]) -> str:
    return shared[0]


@pytest.fixture
def key() -> str:
    """A key no other test used: a fresh tenant of the shared server."""
    return next(_unused_keys)


@pytest.fixture
def keys() -> tuple[str, str]:
    """Two keys no other test used: two fresh tenants of the shared server."""
    return next(_unused_keys), next(_unused_keys)


def test_files_round_trip_and_filenames_are_never_paths(
    shared: tuple[str, Path], keys: tuple[str, str]
) -> None:
    url, state = shared
    client = sdk(url, keys[0])
    data = batch_file(3)
    raw = client.files.with_raw_response.create(
        file=("../../escape.jsonl", data), purpose="batch"
    ).http_response.json()
    record = shaped(FileObject, raw)
    assert (record.filename, record.bytes, record.purpose) == (
        "../../escape.jsonl",
        len(data),
        "batch",
    )
    assert client.files.retrieve(record.id) == record
    assert client.files.content(record.id).read() == data
    assert not list(state.parent.rglob("escape.jsonl"))  # a name, not a place
    stored = next(state.rglob(record.id))
    assert stored.read_bytes() == data and stored.stat().st_mode & 0o777 == 0o600
    deleted = client.files.with_raw_response.delete(record.id).http_response.json()
    assert shaped(FileDeleted, deleted) == FileDeleted(id=record.id, deleted=True, object="file")
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(record.id)


def test_files_list_is_a_cursor_page(url: str, key: str) -> None:
    a = key
    client = sdk(url, a)
    ids = [client.files.create(file=(f"f{i}.jsonl", batch_file(1)), purpose="batch").id
           for i in range(5)]  # fmt: skip
    newest_first = list(reversed(ids))
    assert [f.id for f in client.files.list(limit=2)] == newest_first  # the SDK follows pages
    first = client.files.list(limit=2, order="asc")
    assert [f.id for f in first.data] == ids[:2] and first.has_more
    page = http(url, a).get("/v1/files", params={"after": ids[3], "order": "asc"}).json()
    assert [f["id"] for f in page["data"]] == ids[4:]
    assert (page["first_id"], page["last_id"], page["has_more"]) == (ids[4], ids[4], False)
    assert client.files.list(purpose="batch_output").data == []


def test_a_batch_runs_to_output_and_error_files(url: str, key: str) -> None:
    a = key
    client = sdk(url, a)
    lines = [line(f"q{i}", f"question {i}") for i in range(5)] + [line("bad", "FAIL please")]
    upload = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    raw = client.batches.with_raw_response.create(
        input_file_id=upload.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "one"},
    ).http_response.json()
    created = shaped(Batch, raw)
    assert created.status in ("validating", "in_progress") and created.metadata == {"run": "one"}
    done = wait_batch(client, created.id)
    shaped(Batch, http(url, a).get(f"/v1/batches/{done.id}").json())
    assert done.status == "completed"
    assert done.request_counts.model_dump() == {"total": 6, "completed": 5, "failed": 1}
    output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in output] == [f"q{i}" for i in range(5)]
    assert output[0]["response"]["body"]["choices"][0]["message"]["content"] == "echo: question 0"
    (error,) = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert error["custom_id"] == "bad" and error["response"]["status_code"] == 400
    for file_id in (done.output_file_id, done.error_file_id):
        assert client.files.retrieve(file_id).purpose == "batch_output"
    with pytest.raises(openai.BadRequestError) as refused:  # an output file is no input
        client.batches.create(
            input_file_id=done.output_file_id, endpoint="/v1/chat/completions",
            completion_window="24h",
        )  # fmt: skip
    assert refused.value.param == "input_file_id"


async def test_async_sdk_lists_batches_page_by_page(url: str, key: str) -> None:
    a = key
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=a, max_retries=0)
    upload = await client.files.create(file=("in.jsonl", batch_file(1)), purpose="batch")
    ids = []
    for _ in range(5):
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        ids.append(batch.id)
    assert [b.id async for b in client.batches.list(limit=2)] == ids[::-1]
    first = await client.batches.list(limit=2)
    raw = http(url, a).get("/v1/batches", params={"limit": 2}).json()
    assert [b.id for b in first.data] == ids[::-1][:2] == [b["id"] for b in raw["data"]]
    assert (raw["first_id"], raw["last_id"], raw["has_more"]) == (ids[4], ids[3], True)
    last = http(url, a).get("/v1/batches", params={"after": ids[1]}).json()
    assert [b["id"] for b in last["data"]] == [ids[0]] and last["has_more"] is False
    await client.close()


def test_cancel_keeps_the_finished_lines(url: str, key: str) -> None:
    a = key
    client = sdk(url, a)
    lines = [line(f"fast{i}", "quick") for i in range(4)]
    lines += [line(f"slow{i}", f"SLOW {i}") for i in range(12)]
    upload = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_sync(lambda: finished(client.batches.retrieve(batch.id)) == 4, timeout=30)
    raw = client.batches.with_raw_response.cancel(batch.id).http_response.json()
    cancelled = shaped(Batch, raw)
    assert cancelled.status == "cancelled" and cancelled.cancelled_at is not None
    assert cancelled.request_counts.model_dump() == {"total": 16, "completed": 4, "failed": 12}
    kept = client.files.content(cancelled.output_file_id).text.splitlines()
    assert sorted(json.loads(x)["custom_id"] for x in kept) == [f"fast{i}" for i in range(4)]
    rest = [json.loads(x) for x in client.files.content(cancelled.error_file_id).text.splitlines()]
    assert {r["error"]["code"] for r in rest} == {"batch_cancelled"} and len(rest) == 12
    with pytest.raises(openai.ConflictError):  # OpenAI: 409 for a finished batch
        client.batches.cancel(wait_batch(client, _one_line_batch(client)).id)


def _one_line_batch(client: openai.OpenAI) -> str:
    upload = client.files.create(file=("one.jsonl", batch_file(1)), purpose="batch")
    return client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    ).id


def test_tenants_see_only_their_own_files_and_batches(url: str, keys: tuple[str, str]) -> None:
    a, b = sdk(url, keys[0]), sdk(url, keys[1])
    batch_id = _one_line_batch(a)
    file_id = a.batches.retrieve(batch_id).input_file_id
    for call in (
        lambda: b.files.retrieve(file_id),
        lambda: b.files.content(file_id),
        lambda: b.files.delete(file_id),
        lambda: b.batches.retrieve(batch_id),
        lambda: b.batches.cancel(batch_id),
        lambda: b.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert b.files.list().data == [] and b.batches.list().data == []
    assert [x.id for x in a.batches.list()] == [batch_id]
    assert wait_batch(a, batch_id).status == "completed"


def test_every_route_needs_a_key(url: str, key: str, servers: Servers) -> None:
    a = key
    app_routes = [
        ("POST", "/v1/files"), ("GET", "/v1/files"), ("GET", "/v1/files/file-x"),
        ("GET", "/v1/files/file-x/content"), ("DELETE", "/v1/files/file-x"),
        ("POST", "/v1/batches"), ("GET", "/v1/batches"), ("GET", "/v1/batches/batch_x"),
        ("POST", "/v1/batches/batch_x/cancel"), ("GET", "/v1/models"),
        ("GET", "/v1/models/smollm2"), ("POST", "/v1/chat/completions"),
        ("POST", "/batch-inference/chat-completion"), ("POST", "/batch-inference/jobs"),
        ("GET", "/batch-inference/jobs/batch_x"), ("DELETE", "/batch-inference/jobs/batch_x"),
        ("GET", "/batch-inference/jobs/batch_x/result"), ("GET", "/no/such/route"),
    ]  # fmt: skip
    for bad in (None, a[:-1] + "?"):  # none, and one that differs in its last character
        with http(url, bad) as client:
            for method, path in app_routes:
                response = client.request(method, path)
                assert response.status_code == 401, (bad, method, path)
                assert is_envelope(response)["code"] == "invalid_api_key"
    with http(url, a) as client:
        assert client.get("/v1/models").status_code == 200
        assert client.get("/v1/models", headers={"Authorization": f"bearer {a}"}).is_success
    with pytest.raises(openai.AuthenticationError):
        sdk(url, "wrong").models.list()
    open_url = servers.start("open")  # no keys: no authentication, one tenant
    assert http(open_url, None).get("/v1/files").status_code == 200


def test_idempotency_key_returns_the_same_batch_also_after_a_restart(servers: Servers) -> None:
    url = servers.start(api_keys=[KEY_A])
    client = sdk(url)
    upload = client.files.create(file=("in.jsonl", batch_file(2)), purpose="batch")
    params = {"input_file_id": upload.id, "endpoint": "/v1/chat/completions",
              "completion_window": "24h"}  # fmt: skip
    key = {"Idempotency-Key": "create-once"}
    first = client.batches.create(**params, extra_headers=key)  # type: ignore[arg-type]
    again = client.batches.create(**params, extra_headers=key)  # type: ignore[arg-type]
    assert again.id == first.id
    # an empty metadata object is no metadata: the same request
    empty = client.batches.create(**params, metadata={}, extra_headers=key)  # type: ignore[arg-type]
    assert empty.id == first.id
    other = client.batches.create(**params, extra_headers={"Idempotency-Key": "another"})  # type: ignore[arg-type]
    assert other.id != first.id
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.batches.create(**{**params, "metadata": {"x": "y"}}, extra_headers=key)  # type: ignore[arg-type]
    assert refused.value.code == "idempotency_key_reused"
    servers.stack.close()
    restarted = servers.start(api_keys=[KEY_A])
    assert sdk(restarted).batches.create(**params, extra_headers=key).id == first.id  # type: ignore[arg-type]


def test_models_and_one_request_through_the_same_provider(url: str, key: str) -> None:
    a = key
    client = sdk(url, a)
    (model,) = client.models.list().data
    assert (model.id, model.object) == ("smollm2", "model")
    assert client.models.retrieve("smollm2").id == "smollm2"
    answer = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "hello there"}], max_tokens=8
    )
    assert answer.choices[0].message.content == "echo: hello there"
    with pytest.raises(openai.BadRequestError) as refused:  # the upstream's refusal, as it came
        client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "FAIL"}]
        )
    assert refused.value.param == "max_tokens" and "too large" in refused.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as streamed:
        client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "x"}], stream=True
        )
    assert streamed.value.param == "stream"


def test_text_completions_and_embeddings_pass_through_when_the_provider_serves_them(
    url: str, key: str
) -> None:
    client = sdk(url, key)
    text = client.completions.create(model="smollm2", prompt="once upon", max_tokens=8)
    assert text.choices[0].text == "echo: once upon"
    vectors = client.embeddings.create(model="smollm2", input=["a cat", "a dog"])
    assert [e.index for e in vectors.data] == [0, 1] and len(vectors.data[0].embedding) > 0


def test_the_original_routes(url: str, key: str, servers: Servers) -> None:
    a = key
    client = http(url, a)
    conversations = [
        [{"role": "user", "content": "first"}],
        [{"role": "nobody", "content": "not a message"}],
        [{"role": "user", "content": "third"}],
    ]
    response = client.post(
        "/batch-inference/chat-completion",
        json={"model": "smollm2", "messages_batch": conversations,
              "sampling_params": {"max_tokens": 8}},
    )  # fmt: skip
    from batchclient import BatchChatCompletionResponse

    result = BatchChatCompletionResponse.model_validate(response.json())
    assert [item.error is None for item in result.batch] == [True, False, True]
    assert result.batch[0].text == "echo: first"
    assert [item.error.code for item in result.batch if item.error] == ["invalid_request"]
    upload = sdk(url, a).files.create(file=("in.jsonl", batch_file(3)), purpose="batch")
    job_id = client.post("/batch-inference/jobs", json={"file_id": upload.id}).json()["job_id"]
    for _ in range(600):
        status = client.get(f"/batch-inference/jobs/{job_id}").json()
        if status == "completed":
            break
        assert status in ("scheduled", "in_progress")
    done = BatchChatCompletionResponse.model_validate(
        client.get(f"/batch-inference/jobs/{job_id}/result").json()
    )
    assert [item.custom_id for item in done.batch] == ["r0", "r1", "r2"]
    assert client.delete(f"/batch-inference/jobs/{job_id}").status_code == 409
    assert client.get("/batch-inference/jobs/batch_nope").status_code == 404
    small = http(servers.start("small", api_keys=[a], max_sync_conversations=2), a)
    over = small.post(
        "/batch-inference/chat-completion",
        json={"model": "smollm2", "messages_batch": conversations},
    )
    error = is_envelope(over)
    assert over.status_code == 400 and error["param"] == "messages_batch"
    assert "at most 2" in error["message"] and "/batch-inference/jobs" in error["message"]


def test_an_upload_over_the_cap_is_413_and_leaves_nothing(servers: Servers, tmp_path: Path) -> None:
    url = servers.start(api_keys=[KEY_A], max_upload_bytes=1000)
    client = sdk(url)
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("big.jsonl", b"x" * 5000), purpose="batch")
    assert refused.value.status_code == 413
    body = multipart({"purpose": "batch", "file": b"y" * 1200})
    chunked = http(
        url
    ).post(  # no Content-Length: refused while it streams
        "/v1/files", content=iter([body[:700], body[700:]]), headers=MULTIPART
    )
    assert chunked.status_code == 413 and is_envelope(chunked)["code"] == "file_too_large"
    assert client.files.create(file=("ok.jsonl", b"z" * 900), purpose="batch").bytes == 900
    leftovers = [p.name for p in tmp_path.rglob("*") if p.is_file() and ".tmp" in p.name]
    assert leftovers == []
    too_big = http(url).post(
        "/v1/chat/completions",
        content=b"{" * (33 << 20),
        headers={"Content-Type": "application/json"},
    )
    assert too_big.status_code == 413 and is_envelope(too_big)["code"] == "request_too_large"


def test_one_log_line_per_request_and_never_a_key(
    url: str, keys: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = keys
    caplog.set_level(logging.INFO, logger="batchclient.server")
    client = sdk(url, a)
    client.models.list()
    secret_text = "a very private prompt"
    client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": secret_text}]
    )
    with pytest.raises(openai.AuthenticationError):
        sdk(url, "not-a-key-" + b).models.list()
    pattern = re.compile(r"^(GET|POST) (/v1/models|/v1/chat/completions) (200|401) \d+\.\d ms$")

    def logged() -> list[str]:
        lines = [r.getMessage() for r in caplog.records if r.name == "batchclient.server"]
        return [x for x in lines if pattern.match(x)]

    # the server's thread writes a request's line just after the answer has gone out
    wait_sync(lambda: len(logged()) >= 3, timeout=10)
    assert len(logged()) == 3, logged()
    assert a not in caplog.text and b not in caplog.text and secret_text not in caplog.text


CHAT: dict[str, Any] = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
BATCH: dict[str, Any] = {"input_file_id": "file-nope", "endpoint": "/v1/chat/completions"}
BAD_INPUT = [
    # (method, path, body: dict = JSON | bytes = raw, headers, status, param)
    ("POST", "/v1/batches", b"{not json", None, 400, None),
    ("POST", "/v1/batches", b"[1, 2]", None, 400, None),
    ("POST", "/v1/batches", b"", None, 400, None),
    ("POST", "/v1/batches", b"\xff\xfe{}", None, 400, None),
    ("POST", "/v1/batches", {}, None, 400, "input_file_id"),
    ("POST", "/v1/batches", {"input_file_id": 5, "endpoint": "x"}, None, 400, "input_file_id"),
    ("POST", "/v1/batches", BATCH, None, 404, "input_file_id"),
    ("POST", "/v1/batches", dict(BATCH, endpoint="/v1/images"), None, 400, "endpoint"),
    ("POST", "/v1/batches", dict(BATCH, completion_window="soon"), None, 400,
     "completion_window"),
    ("POST", "/v1/batches", dict(BATCH, metadata={"k": 1}), None, 400, "metadata.k"),
    ("POST", "/v1/batches", dict(BATCH, metadata={str(i): "v" for i in range(17)}), None, 400,
     "metadata"),
    ("POST", "/v1/batches", dict(BATCH, output_expires_after={"anchor": "created_at",
     "seconds": 5}), None, 400, "output_expires_after.seconds"),
    ("POST", "/v1/batches", BATCH, {"Idempotency-Key": "k" * 300}, 400, "Idempotency-Key"),
    ("GET", "/v1/batches?limit=0", None, None, 400, "limit"),
    ("GET", "/v1/batches?limit=many", None, None, 400, "limit"),
    ("GET", "/v1/batches?after=batch_nope", None, None, 400, "after"),
    ("GET", "/v1/batches/batch_nope", None, None, 404, "batch_id"),
    ("POST", "/v1/batches/batch_nope/cancel", None, None, 404, "batch_id"),
    ("GET", "/v1/files?order=sideways", None, None, 400, "order"),
    ("GET", "/v1/files?after=file-nope", None, None, 400, "after"),
    ("GET", "/v1/files/file-nope", None, None, 404, "file_id"),
    ("GET", "/v1/files/file-nope/content", None, None, 404, "file_id"),
    ("DELETE", "/v1/files/file-nope", None, None, 404, "file_id"),
    ("POST", "/v1/files", {"purpose": "batch"}, None, 400, None),
    ("POST", "/v1/files", multipart({"purpose": "batch"}), MULTIPART, 400, "file"),
    ("POST", "/v1/files", multipart({"file": b"{}"}), MULTIPART, 400, "purpose"),
    ("POST", "/v1/files", multipart({"purpose": "fine-tune", "file": b"{}"}), MULTIPART, 400,
     "purpose"),
    ("POST", "/v1/files", multipart({"purpose": "batch", "file": b"{}", "expires_after": "1"}),
     MULTIPART, 400, "expires_after"),
    ("POST", "/v1/files", multipart({"purpose": "batch", "file": b"{}"})[:-20], MULTIPART, 400,
     None),
    ("POST", "/v1/files", b"--B\r\ngarbage", MULTIPART, 400, None),
    ("POST", "/v1/files", multipart({"purpose": "batch", "file": b"1", "file ": b"2"})
     .replace(b'name="file "', b'name="file"'), MULTIPART, 400, "file"),
    ("POST", "/v1/chat/completions", {}, None, 400, "model"),
    ("POST", "/v1/chat/completions", {"model": "smollm2"}, None, 400, "messages"),
    ("POST", "/v1/chat/completions", dict(CHAT, messages=[]), None, 400, "messages"),
    ("POST", "/v1/chat/completions", dict(CHAT, stream=True), None, 400, "stream"),
    ("POST", "/v1/chat/completions", dict(CHAT, model="gpt-9"), None, 404, "model"),
    ("POST", "/v1/images/generations", {"model": "smollm2", "prompt": "x"}, None, 404, None),
    ("GET", "/v1/models/gpt-9", None, None, 404, "model"),
    ("GET", "/v1/nowhere", None, None, 404, None),
    ("DELETE", "/v1/models", None, None, 405, None),
    ("POST", "/batch-inference/chat-completion", {"model": "smollm2"}, None, 400,
     "messages_batch"),
    ("POST", "/batch-inference/chat-completion",
     {"model": "smollm2", "messages_batch": [], "sampling_params": {"max_tokens": -1}}, None,
     400, "sampling_params.max_tokens"),
    ("POST", "/batch-inference/chat-completion",
     {"model": "gpt-9", "messages_batch": [[{"role": "user", "content": "x"}]]}, None, 404,
     "model"),
    ("POST", "/batch-inference/chat-completion",
     {"model": "smollm2", "messages_batch": [[]], "tool_choice": "required"}, None, 400,
     "tool_choice"),
    ("POST", "/batch-inference/jobs", {"file_id": "file-nope"}, None, 404, "file_id"),
    ("POST", "/batch-inference/jobs", {"file": "x"}, None, 400, "file_id"),
    ("GET", "/batch-inference/jobs/batch_nope", None, None, 404, "job_id"),
    ("DELETE", "/batch-inference/jobs/batch_nope", None, None, 404, "job_id"),
    ("GET", "/batch-inference/jobs/batch_nope/result", None, None, 404, "job_id"),
]  # fmt: skip


def test_bad_input_gets_openai_error_envelopes_never_a_500(url: str, key: str) -> None:
    a = key
    with http(url, a) as client:
        for method, path, body, headers, status, param in BAD_INPUT:
            content = body if isinstance(body, bytes) else None
            payload = body if isinstance(body, dict) else None
            if content is not None and headers is None:  # raw bytes sent as JSON
                headers = {"Content-Type": "application/json"}
            response = client.request(method, path, content=content, json=payload, headers=headers)
            where = f"{method} {path} {str(body)[:60]}"
            assert response.status_code == status, (where, response.text)
            assert is_envelope(response)["param"] == param, (where, response.text)
