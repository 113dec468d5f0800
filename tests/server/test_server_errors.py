"""``batchclient serve`` on a real uvicorn server over a loopback stub: every refusal in OpenAI's
envelope with the right status (never a 500 for bad input or an unlucky disk), and the original
protocol's result streamed rather than built whole on the event loop."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.responses import JSONResponse

from batchclient import BatchChatCompletionResponse, ConfigurationError, RemoteBatchInference
from batchclient._core.request import error_type
from batchclient.errors import ErrorCode, FileNotFoundInStoreError
from batchclient.jobs._store import Store
from batchclient.remote import RemoteProvider
from batchclient.server import (
    _routes_inference,
    _routes_original,
    create_app,
    http_protocol,
    tenant_id,
)
from batchclient.server._errors import redact_paths
from batchclient.testing import AppServer, Fault, StubReply, StubServer, free_port
from batchclient.types import FileObject
from jobs_util import jsonl, line, wait_sync
from server_util import KEY_A, KEY_B, Servers, batch_file, http, is_envelope, ready, sdk, wait_batch

SRC = Path(__file__).parents[2] / "src"
BARE = {"error": {"message": "max_tokens is too large"}}  # no type, param or code
DETAIL = {"detail": [{"loc": ["body", "n"], "msg": "bad n"}], "extra": 1}  # FastAPI's shape


pytestmark = pytest.mark.stub(
    faults=[
        Fault(StubReply(delay_s=30), match="SLOW"),
        Fault(StubReply(status=400, body=BARE), match="BARE"),
        Fault(StubReply(status=422, body=DETAIL), match="DETAIL"),
    ]
)


@pytest.fixture
def servers(stub: StubServer, tmp_path: Path) -> Iterator[Servers]:
    pool = Servers(stub.url, tmp_path)
    with pool.stack:
        yield pool


# ---------------------------------------------------------------------------- the result route


def test_the_original_result_is_streamed_page_by_page_in_the_same_shape(
    servers: Servers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over three pages of items (pages of 7 here, 500 served): chunked, no
    ``Content-Length``, and byte for byte the document ``JSONResponse`` made of the whole
    result; 404 and 409 still come as envelopes before anything is streamed."""
    monkeypatch.setattr(_routes_original, "_PAGE", 7)
    url = servers.start(api_keys=[KEY_A])
    client, raw = sdk(url), http(url)
    assert is_envelope(got := raw.get("/batch-inference/jobs/batch_nope/result"))
    assert got.status_code == 404
    n = 15
    upload = client.files.create(file=("in.jsonl", batch_file(n)), purpose="batch")
    slow = client.files.create(file=("slow.jsonl", batch_file(1, "SLOW")), purpose="batch")
    job = raw.post("/batch-inference/jobs", json={"file_id": slow.id}).json()["job_id"]
    busy = raw.get(f"/batch-inference/jobs/{job}/result")
    assert busy.status_code == 409 and is_envelope(busy)["code"] == "conflict"
    raw.delete(f"/batch-inference/jobs/{job}")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert wait_batch(client, batch.id).status == "completed"
    got = raw.get(f"/batch-inference/jobs/{batch.id}/result")
    assert got.status_code == 200 and got.headers["content-type"] == "application/json"
    assert "content-length" not in got.headers and got.headers["transfer-encoding"] == "chunked"
    result = BatchChatCompletionResponse.model_validate(got.json())
    assert [item.custom_id for item in result.batch] == [f"r{i}" for i in range(n)]
    assert got.content == JSONResponse(result.model_dump(mode="json")).body
    assert json.loads(got.content)["batch"][0]["completion_message"]["content"]


# ---------------------------------------------------------------------------- wrong errors


@pytest.mark.parametrize("window", ["1e15d", "1e300h", "3651d"])
def test_an_absurd_completion_window_is_a_400_not_a_500(servers: Servers, window: str) -> None:
    url = servers.start(api_keys=[KEY_A])
    raw = http(url)
    upload = sdk(url).files.create(file=("in.jsonl", batch_file(1)), purpose="batch")
    body = {"input_file_id": upload.id, "endpoint": "/v1/chat/completions"}
    got = raw.post("/v1/batches", json={**body, "completion_window": window})
    assert got.status_code == 400 and is_envelope(got)["param"] == "completion_window"
    assert "3650d" in got.json()["error"]["message"]
    old = raw.post(
        "/batch-inference/jobs", json={"file_id": upload.id, "completion_window": window}
    )
    assert old.status_code == 400 and "3650d" in is_envelope(old)["message"]
    assert raw.get("/v1/batches").json()["data"] == []


async def test_an_absurd_completion_window_is_a_configuration_error(
    stub: StubServer, tmp_path: Path
) -> None:
    async with RemoteBatchInference(stub.url, state_dir=tmp_path) as client:
        upload = await client.files.create(batch_file(1), purpose="batch")
        with pytest.raises(ConfigurationError, match="3650d"):
            await client.batches.create(upload.id, completion_window="1e15d")
        assert await client.batches.list() == []


def test_a_bad_range_on_a_download_is_a_400_or_416_envelope(servers: Servers) -> None:
    url = servers.start(api_keys=[KEY_A])
    content = batch_file(2)
    size = len(content)
    upload = sdk(url).files.create(file=("in.jsonl", content), purpose="batch")
    path = f"/v1/files/{upload.id}/content"
    with http(url) as c:
        for header in ("bytes", "items=0-10", "bytes=5-2", "bytes=x-y", "bytes=,"):
            r = c.get(path, headers={"Range": header})
            assert r.status_code == 400, (header, r.status_code, r.text)
            assert is_envelope(r)["type"] == "invalid_request_error", header
        for header in (f"bytes={size}-", f"bytes={size + 10}-{size + 20}", "bytes=-0"):
            r = c.get(path, headers={"Range": header})
            assert r.status_code == 416, (header, r.status_code, r.text)
            assert r.headers["content-range"] == f"bytes */{size}"
            assert is_envelope(r)["code"] == "range_not_satisfiable"
        r = c.get(path, headers={"Range": "bytes=0-9"})  # a good range still works
        assert r.status_code == 206 and r.content == content[:10]
        assert r.headers["content-range"] == f"bytes 0-9/{size}"
        assert c.get(path).content == content


def test_idempotency_compares_the_request_not_its_spelling(servers: Servers) -> None:
    """The same request with and without its defaulted fields is the same request (the same
    batch back); another request under the key is still a 422."""
    url = servers.start(api_keys=[KEY_A])
    raw = http(url)
    upload = sdk(url).files.create(file=("in.jsonl", batch_file(1)), purpose="batch")
    body = {"input_file_id": upload.id, "endpoint": "/v1/chat/completions"}
    key = {"Idempotency-Key": "retry-1"}
    first = raw.post("/v1/batches", json=body, headers=key)
    spelled = {**body, "completion_window": "24h", "metadata": None}
    again = raw.post("/v1/batches", json=spelled, headers=key)
    assert first.status_code == again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]
    other = raw.post("/v1/batches", json={**body, "completion_window": "1h"}, headers=key)
    assert other.status_code == 422 and is_envelope(other)["code"] == "idempotency_key_reused"


def test_validation_errors_keep_the_api_paths_they_name(servers: Servers) -> None:
    """Messages are cut of the server's file paths, not of the API's URLs: a line for
    ``/v1/completions`` in a chat batch says both URLs."""
    url = servers.start(api_keys=[KEY_A])
    client = sdk(url)
    wrong = line("r0", "hello").replace('"/v1/chat/completions"', '"/v1/completions"')
    upload = client.files.create(file=("in.jsonl", jsonl([wrong])), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    failed = wait_batch(client, batch.id)
    assert failed.status == "failed" and failed.errors is not None and failed.errors.data
    message = failed.errors.data[0].message or ""
    assert "'/v1/completions'" in message and "'/v1/chat/completions'" in message, message
    assert redact_paths("see /etc/x.conf and /v1/chat/completions") == (
        "see <path> and /v1/chat/completions"
    )


@pytest.mark.slow
def test_creating_a_batch_while_its_input_is_deleted_is_404_or_409(servers: Servers) -> None:
    """Creation and deletion racing, many times over: either the batch is created (the delete
    is a 409 while it runs) and completes, or the file is gone first (the create is a 404);
    never a created batch that then fails because its input vanished."""
    url = servers.start(api_keys=[KEY_A])
    client, raw = sdk(url), http(url)
    outcomes = set()
    for i in range(20):
        upload = client.files.create(file=("in.jsonl", batch_file(1, f"x{i}-")), purpose="batch")
        body = {"input_file_id": upload.id, "endpoint": "/v1/chat/completions"}
        with ThreadPoolExecutor(2) as pool:
            creating = pool.submit(http(url).post, "/v1/batches", json=body)
            deleting = pool.submit(http(url).delete, f"/v1/files/{upload.id}")
            created, deleted = creating.result(), deleting.result()
        outcomes.add((created.status_code, deleted.status_code))
        if created.status_code == 200:
            assert deleted.status_code in (200, 409), deleted.text  # 200: it had finished
            batch = wait_batch(client, created.json()["id"])
            assert batch.status == "completed", batch.errors
        else:
            assert (created.status_code, deleted.status_code) == (404, 200), created.text
            assert is_envelope(created)["param"] == "input_file_id"
    assert outcomes <= {(200, 409), (200, 200), (404, 200)}
    assert raw.get("/v1/batches").status_code == 200


def test_a_job_and_the_deletion_of_its_input_come_one_after_the_other(tmp_path: Path) -> None:
    """The store's side of the race above, in the order that used to break: the file is
    deleted after the creation checked it and before the job row is written."""
    store = Store(tmp_path)
    for file_id in ("file-a", "file-b"):
        record = FileObject(id=file_id, bytes=1, created_at=0, filename="x", purpose="batch")
        store.add_file(record, "0" * 64)
    job = {"id": "batch_1", "input_file_id": "file-a", "endpoint": "/v1/chat/completions",
           "completion_window": "24h", "status": "validating", "created_at": 0,
           "identity": "{}"}  # fmt: skip
    store.insert_job(job)
    assert store.delete_unused_file("file-a") == ["batch_1"]  # in use: kept
    assert store.get_file("file-a").id == "file-a"
    assert store.delete_unused_file("file-b") == []
    with pytest.raises(FileNotFoundInStoreError):
        store.insert_job({**job, "id": "batch_2", "input_file_id": "file-b"})
    assert [batch.id for batch in store.list_jobs()] == ["batch_1"]
    with pytest.raises(FileNotFoundInStoreError):
        store.delete_unused_file("file-b")
    store.close()


def test_upstream_error_bodies_are_kept_as_is(servers: Servers) -> None:
    """In the error file, an upstream refusal's body is exactly what the upstream sent (no
    fields added); the one-request passthrough still answers with OpenAI's envelope."""
    url = servers.start(api_keys=[KEY_A])
    client, raw = sdk(url), http(url)
    lines = [line("a", "BARE"), line("b", "DETAIL"), line("c", "fine")]
    upload = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait_batch(client, batch.id)
    assert batch.error_file_id is not None
    errors = [json.loads(x) for x in client.files.content(batch.error_file_id).text.splitlines()]
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [
        ("a", 400),
        ("b", 422),
    ]
    assert errors[0]["response"]["body"] == BARE and errors[1]["response"]["body"] == DETAIL
    for text, status in (("BARE", 400), ("DETAIL", 422)):
        one = {"model": "smollm2", "messages": [{"role": "user", "content": text}]}
        got = raw.post("/v1/chat/completions", json=one)
        assert got.status_code == status and is_envelope(got)["message"]


# ---------------------------------------------------------------------------- a failing disk


def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=16k tmpfs /tmp"]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount(), reason="needs `unshare -rm` to mount a tmpfs")
def test_an_upload_on_a_full_or_read_only_disk_is_a_storage_status(
    stub: StubServer, tmp_path: Path
) -> None:
    """``batchclient serve`` in a private mount namespace: tenant A's files on a 256 KiB tmpfs
    (full), tenant B's on a read-only bind mount. An upload is then 507 ``storage_full`` or
    503 ``storage_unavailable`` in the envelope, naming no path; once the big upload is gone
    a small one fits."""
    state, port = tmp_path / "state", free_port()
    full, read_only = (state / "tenants" / tenant_id(k) / "files" for k in (KEY_A, KEY_B))
    script = f"""
        mkdir -p -m 700 '{state}' '{state}/tenants' '{full.parent}' '{read_only.parent}'
        mkdir -p -m 700 '{full}' '{read_only}'
        mount -t tmpfs -o size=256k,mode=700 tmpfs '{full}'
        mount --bind '{read_only}' '{read_only}'
        mount -o remount,bind,ro '{read_only}'
        exec "$PYTHON" -m batchclient.cli serve --base-url '{stub.url}' --port {port} \\
            --state-dir '{state}' --api-key {KEY_A} --api-key {KEY_B}
    """
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(SRC)}
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        ["unshare", "-rm", "sh", "-euc", script], env=env, stdout=log, stderr=log
    )
    try:
        url = f"http://127.0.0.1:{port}"
        ready(url, proc)
        big = http(url).post("/v1/files", files={"file": ("in.jsonl", batch_file(5000))},
                             data={"purpose": "batch"})  # fmt: skip
        assert big.status_code == 507, big.text
        assert is_envelope(big)["code"] == "storage_full" and str(state) not in big.text
        small = sdk(url).files.create(file=("in.jsonl", batch_file(2)), purpose="batch")
        assert small.bytes > 0
        refused = http(url, KEY_B).post("/v1/files", files={"file": ("in.jsonl", batch_file(2))},
                                        data={"purpose": "batch"})  # fmt: skip
        assert refused.status_code == 503, refused.text
        assert is_envelope(refused)["code"] == "storage_unavailable"
        assert str(state) not in refused.text
        # the CLI's protocol too: a head over its limits is refused in the envelope, or (sent
        # whole, h11 parses it) answered in it; never uvicorn's plain text
        too_long = _raw_get(url, "/v1/files/" + "x" * 100_000)
        head, _, body = too_long.partition(b"\r\n\r\n")
        assert b"content-type: application/json" in head.lower(), too_long[:300]
        assert json.loads(body)["error"]["message"], too_long[:300]
    finally:
        proc.terminate()
        proc.wait(15)
    assert "storage error on POST /v1/files" in (tmp_path / "serve.log").read_text()


# ---------------------------------------------------------------------------- uvicorn's own answers


def _raw_get(url: str, path: str) -> bytes:
    """The whole answer to ``GET path`` sent as raw bytes (httpx refuses such URLs)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_a_request_the_http_parser_refuses_gets_the_envelope(
    stub: StubServer, tmp_path: Path
) -> None:
    """A URL over the parser's limits never reaches the app: uvicorn answers it from its
    protocol, as text unless the server runs with ``http_protocol()``."""
    app = create_app(RemoteProvider(stub.url), state_dir=tmp_path)
    with AppServer(app, http=http_protocol()) as url:
        answer = _raw_get(url, "/v1/files/" + "x" * 100_000)
        garbage = _raw_get(url, "/\x00\x01 nonsense")
    for raw in (answer, garbage):
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in head
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "invalid_http_request"


def test_a_request_cut_by_the_shutdown_grace_gets_the_envelope(
    stub: StubServer, tmp_path: Path
) -> None:
    """A request still running when the shutdown grace ends is cancelled: 503
    ``server_shutting_down`` in the envelope, not uvicorn's plain-text 500."""
    app = create_app(RemoteProvider(stub.url), state_dir=tmp_path)
    server = AppServer(app, timeout_graceful_shutdown=0.3)
    url = server.__enter__()
    try:
        with ThreadPoolExecutor(1) as pool:
            body = {"model": "smollm2", "messages": [{"role": "user", "content": "SLOW"}]}
            pending = pool.submit(http(url, None).post, "/v1/chat/completions", json=body)
            wait_sync(lambda: stub.stats.in_flight > 0, timeout=10, every=0.02)
            server.__exit__(None, None, None)
            got = pending.result(timeout=20)
    finally:
        server.__exit__(None, None, None)
    assert got.status_code == 503, got.text
    assert is_envelope(got)["code"] == "server_shutting_down"


# ---------------------------------------------------------------------------- upstream failures


def test_every_5xx_for_a_request_without_an_answer_is_a_server_error() -> None:
    """The envelope's ``type`` says whose fault it was: a 5xx is never the caller's
    (``invalid_request_error`` told callers to change a request that had nothing wrong)."""
    for code, status in _routes_inference._NO_ANSWER_STATUS.items():
        if status >= 500:
            assert error_type(ErrorCode(code)) == "server_error", code


def test_an_upstream_that_cannot_be_reached_is_a_502_server_error(tmp_path: Path) -> None:
    app = create_app(RemoteProvider(f"http://127.0.0.1:{free_port()}/v1"), state_dir=tmp_path)
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
    with AppServer(app) as url:
        got = http(url, None).post("/v1/chat/completions", json=body)
    assert got.status_code in (502, 503), got.text
    error = is_envelope(got)
    assert error["type"] == "server_error", error
    assert error["code"] in ("connection_error", "endpoint_unavailable"), error
