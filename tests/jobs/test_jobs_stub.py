"""Jobs on the remote provider against the fault-injecting loopback stub (real sockets, a real
SQLite file in a temporary state directory): refused files, unsupported fields, cancel, failure
and expiry keeping finished work, error records in OpenAI's shape, resume in a new client."""

from __future__ import annotations

import io
import itertools
import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from batchclient import (
    BatchChatCompletionResponse,
    BatchClient,
    ErrorCode,
    FileNotFoundInStoreError,
    JobNotFoundError,
    JobStateError,
    JobStatus,
    RemoteBatchInference,
    Request,
    Result,
    failed,
)
from batchclient.remote import Ejection, RemoteProvider
from batchclient.testing import Fault, StubReply, StubServer
from batchclient.types import Batch, BatchError
from jobs_util import FAST, jsonl, line, until


def entries(job: Batch) -> list[BatchError]:
    """The validation errors of a job (OpenAI shape: ``errors.data``)."""
    return job.errors.data if job.errors else []


def client(stub: StubServer, state: Path, **kw: Any) -> RemoteBatchInference:
    return RemoteBatchInference(stub.url, state_dir=state, **{**FAST, **kw})


async def run_file(c: BatchClient, lines: list[str], bom: bool = False, **kw: Any) -> Any:
    record = await c.files.create((b"\xef\xbb\xbf" if bom else b"") + jsonl(lines))
    job = await c.schedule_batch(record.id, **kw)
    with anyio.fail_after(60):
        return await c.batches.wait(job.job_id)


async def lines_of(c: BatchClient, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in (await c.files.content(file_id)).decode().splitlines()]


# ------------------------------------------------------------------------------ basics


async def test_job_end_to_end_output_in_openai_format(tmp_path: Path) -> None:
    with StubServer(latency_s=0.005, jitter_s=0.02) as stub:
        async with client(stub, tmp_path) as c:
            job = await run_file(c, [line(f"r{i}", f"TOKEN-{i}") for i in range(60)])
            assert job.status == "completed"
            assert job.request_counts.model_dump() == {"total": 60, "completed": 60, "failed": 0}
            assert job.error_file_id is None and job.usage.output_tokens > 0
            assert job.in_progress_at and job.finalizing_at and job.completed_at
            out = await lines_of(c, job.output_file_id)
            result = await c.job_result(job.id)
            assert await c.job_status(job.id) == JobStatus.completed
            assert await c.job_status("batch_nope") is None
            listed = await c.batches.list()
    assert [r["custom_id"] for r in out] == [f"r{i}" for i in range(60)]
    for i, row in enumerate(out):
        assert set(row) == {"id", "custom_id", "response", "error"} and row["error"] is None
        assert row["response"]["status_code"] == 200
        assert row["response"]["body"]["choices"][0]["message"]["content"] == f"echo: TOKEN-{i}"
    # every custom_id once, each with its own answer, in input order
    assert isinstance(result, BatchChatCompletionResponse)
    assert [r.custom_id for r in result.batch] == [f"r{i}" for i in range(60)]
    assert all(r.text == f"echo: TOKEN-{i}" for i, r in enumerate(result.batch))
    assert [j.id for j in listed] == [job.id]
    assert stub.stats.requests == 60


def _usage_reply(number: str) -> StubReply:
    """A well-formed ChatCompletion whose usage counts are the JSON literal ``number``."""
    raw = (
        '{"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "smollm2",'
        ' "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"},'
        ' "finish_reason": "stop"}],'
        f' "usage": {{"prompt_tokens": {number}, "completion_tokens": {number},'
        ' "total_tokens": 2}}'
    )
    return StubReply(raw=raw.encode())


async def test_token_counts_no_integer_column_holds_count_nothing_and_lose_nothing(
    tmp_path: Path,
) -> None:
    """Usage numbers that SQLite cannot store (2**70; 1e400, read as infinity; NaN) or that are
    no token count (negative, a string) count 0 tokens: every answer is kept, the batch
    completes, and its stored rows read back."""
    numbers = {"huge": str(2**70), "inf": "1e400", "nan": "NaN", "neg": "-5", "text": '"7"'}
    faults = [Fault(_usage_reply(n), match=f"{k} please") for k, n in numbers.items()]
    lines = [line(k, f"{k} please") for k in numbers] + [line("plain", "plain")]
    with StubServer(faults=faults) as stub:
        async with client(stub, tmp_path) as c:
            job = await run_file(c, lines)
            out = await lines_of(c, job.output_file_id)
            result = await c.job_result(job.id)
    assert job.status == "completed", job.errors
    assert job.request_counts.model_dump() == {"total": 6, "completed": 6, "failed": 0}
    assert [r["custom_id"] for r in out] == [*numbers, "plain"]
    assert isinstance(result, BatchChatCompletionResponse)
    assert all(r.text == "fine" for r in result.batch[:5]) and result.batch[5].text
    assert job.usage.input_tokens == result.batch[5].metric("prompt_tokens")


async def test_files_api(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(jsonl([line("a", "x")]))
    with StubServer() as stub:
        async with client(stub, tmp_path / "state") as c:
            from_path = await c.files.create(src)
            from_bytes = await c.files.create(b"abc", filename="b.jsonl")
            from_binary = await c.files.create(io.BytesIO(b"xyz"))
            from_text = await c.files.create(io.StringIO("caf\u00e9"))
            assert (from_path.filename, from_path.bytes) == ("in.jsonl", src.stat().st_size)
            assert await c.files.content(from_path.id) == src.read_bytes()
            assert await c.files.content(from_text.id) == "caf\u00e9".encode()
            assert (from_bytes.filename, from_bytes.bytes, from_binary.bytes) == ("b.jsonl", 3, 3)
            assert {f.id for f in await c.files.list()} == {
                from_path.id,
                from_bytes.id,
                from_binary.id,
                from_text.id,
            }
            await c.files.delete(from_bytes.id)
            with pytest.raises(FileNotFoundInStoreError):
                await c.files.retrieve(from_bytes.id)
            with pytest.raises(FileNotFoundInStoreError):
                await c.schedule_batch("file-missing")
            with pytest.raises(JobNotFoundError):
                await c.batches.retrieve("batch_missing")
            assert (await c.files.path(from_path.id)).read_bytes() == src.read_bytes()


async def test_input_of_a_running_job_cannot_be_deleted(tmp_path: Path) -> None:
    with StubServer(latency_s=0.5) as stub:
        async with client(stub, tmp_path, max_concurrency=2) as c:
            record = await c.files.create(jsonl([line(f"r{i}", "x") for i in range(6)]))
            job = await c.schedule_batch(record.id)
            with pytest.raises(JobStateError, match="unfinished"):
                await c.files.delete(record.id)
            with pytest.raises(JobStateError, match="wait"):
                await c.job_result(job.job_id)
            await c.job_cancel(job.job_id)
            await c.files.delete(record.id)


# ------------------------------------------------------------------------------ refused files


async def test_duplicate_custom_id_fails_fast_and_runs_nothing(tmp_path: Path) -> None:
    with StubServer() as stub:
        async with client(stub, tmp_path) as c:
            started = time.monotonic()
            job = await run_file(c, [line("a", "1"), line("b", "2"), line("a", "3")])
            took = time.monotonic() - started
            with pytest.raises(JobStateError, match="duplicate_custom_id"):
                await c.job_result(job.id)
    assert job.status == "failed" and job.failed_at is not None and took < 5
    assert [(e.code, e.line, e.param) for e in entries(job)] == [
        ("duplicate_custom_id", 3, "custom_id")
    ]
    assert job.output_file_id is None and job.error_file_id is None
    assert stub.stats.requests == 0


async def test_blank_lines_in_a_job(tmp_path: Path) -> None:
    data = (line("a", "1") + "\n\n   \n" + line("b", "2") + "\n\n").encode()
    with StubServer() as stub:
        async with client(stub, tmp_path) as c:
            record = await c.files.create(data)
            job = await c.batches.wait((await c.schedule_batch(record.id)).job_id)
            empty = await run_file(c, ["", "  "])
    assert job.status == "completed" and job.request_counts.total == 2
    assert empty.status == "failed" and [e.code for e in entries(empty)] == ["empty_file"]


async def test_refused_files_list_every_bad_line(tmp_path: Path) -> None:
    bad_method = json.loads(line("c", "x"))
    del bad_method["method"]
    with StubServer() as stub:
        async with client(stub, tmp_path) as c:
            not_requests = await run_file(c, [line("a", "x"), "[1,2,3]", json.dumps(bad_method)])
            mixed_models = await run_file(
                c,
                [
                    line("a", "x"),
                    line("b", "x", model="other-model"),
                    line("c", "x", model="no-such-model"),
                ],
            )
            unknown = await run_file(c, [line("a", "x", model="no-such-model")])
    assert [(e.code, e.line) for e in entries(not_requests)] == [
        ("invalid_json_line", 2),
        ("missing_required_parameter", 3),
    ]
    assert [(e.code, e.line) for e in entries(mixed_models)] == [
        ("mismatched_model", 2),
        ("mismatched_model", 3),
    ]
    # a single-model file naming a model the endpoint does not serve: refused, nothing runs
    assert unknown.status == "failed"
    assert [(e.code, e.param) for e in entries(unknown)] == [("model_not_found", "body.model")]
    assert "no-such-model" in entries(unknown)[0].message
    assert stub.stats.requests == 0


# ------------------------------------------------------------------------------ unsupported fields


class RefusingProvider(RemoteProvider):
    """A provider that cannot honour ``logit_bias`` and says so, as providers must (vllm
    #50026: fields ignored with a 200)."""

    async def execute(self, request: Request) -> Result:
        if "logit_bias" in request.body:
            return failed(
                ErrorCode.unsupported_parameter,
                "logit_bias is not supported by this provider",
                status_code=400,
                param="logit_bias",
            )
        return await super().execute(request)


async def test_unsupported_fields_reach_the_error_file_and_the_result(tmp_path: Path) -> None:
    with StubServer() as stub:
        async with BatchClient(RefusingProvider(stub.url), state_dir=tmp_path) as c:
            job = await run_file(c, [line("ok", "x"), line("lb", "y", logit_bias={"1": 5})])
            streamed = await run_file(c, [line("s", "z", stream=True)])
            errors = await lines_of(c, job.error_file_id)
            result = await c.job_result(job.id)
    assert job.request_counts.model_dump() == {"total": 2, "completed": 1, "failed": 1}
    assert errors[0]["custom_id"] == "lb" and errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["param"] == "logit_bias"
    err = result.batch[1].error
    assert err is not None and (err.code, err.param) == ("unsupported_parameter", "logit_bias")
    assert [(e.code, e.param) for e in entries(streamed)] == [
        ("streaming_unsupported", "body.stream")
    ]
    assert stub.stats.requests == 1


# ------------------------------------------------------------------------------ cancel, failure


@pytest.mark.slow
async def test_cancel_stops_in_flight_work_and_keeps_finished_results(
    tmp_path: Path,
) -> None:
    with StubServer(latency_s=0.05, jitter_s=1.5) as stub:
        async with client(stub, tmp_path, max_concurrency=16) as c:
            record = await c.files.create(jsonl([line(f"r{i}", f"long {i}") for i in range(200)]))
            job_id = (await c.schedule_batch(record.id)).job_id
            await until(lambda: c.batches.retrieve(job_id), within=10)
            await until(lambda: _completed_at_least(c, job_id, 5), within=30, every=0.01)
            started = time.monotonic()
            await c.job_cancel(job_id)
            took = time.monotonic() - started
            job = await c.batches.retrieve(job_id)
            await until(lambda: stub.stats.in_flight == 0, within=3)
            await anyio.sleep(0.5)
            later = await c.batches.retrieve(job_id)
            result = await c.job_result(job_id)
            out = await lines_of(c, job.output_file_id)
            errors = await lines_of(c, job.error_file_id)
            await c.job_cancel(job_id)  # already cancelled: a no-op
            done = await run_file(c, [line("x", "y")])
            with pytest.raises(JobStateError, match="completed"):
                await c.job_cancel(done.id)
    assert took < 3.0
    assert job.status == "cancelled" and job.cancelling_at and job.cancelled_at
    counts = job.request_counts
    assert counts.completed >= 5 and counts.completed + counts.failed == 200
    assert later.request_counts == counts  # no new result after `cancelled`
    assert len(out) == counts.completed and len(errors) == counts.failed
    for row in out:  # finished work is kept with its real response
        assert row["response"]["body"]["choices"][0]["message"]["content"].startswith("echo: long")
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert all(e["response"] is None for e in errors)
    assert sum(r.error is None for r in result.batch) == counts.completed
    assert [r.custom_id for r in result.batch] == [f"r{i}" for i in range(200)]
    assert stub.stats.requests < 200  # in-flight requests were aborted, the rest never sent


async def _completed_at_least(c: RemoteBatchInference, job_id: str, n: int) -> bool:
    return (await c.batches.retrieve(job_id)).request_counts.completed >= n


# A dead server is ejected for a moment rather than the default 10 s, so the retries that wait
# for it to come back end in well under a second.
SHORT_EJECTION = Ejection(after=3, duration_s=0.2)


async def test_server_killed_after_5_completions_keeps_finished_results(
    tmp_path: Path,
) -> None:
    stub = StubServer(latency_s=0.05, jitter_s=0.6).start()
    try:
        async with client(
            stub,
            tmp_path,
            max_concurrency=8,
            max_retries=1,
            timeout_s=10.0,
            ejection=SHORT_EJECTION,
        ) as c:
            record = await c.files.create(jsonl([line(f"r{i}", f"q{i}") for i in range(40)]))
            job_id = (await c.schedule_batch(record.id)).job_id
            await until(lambda: _completed_at_least(c, job_id, 5), within=30, every=0.01)
            await anyio.to_thread.run_sync(stub.kill)
            with anyio.fail_after(60):
                job = await c.batches.wait(job_id)
            result = await c.job_result(job_id)
            out = await lines_of(c, job.output_file_id)
            errors = await lines_of(c, job.error_file_id)
    finally:
        stub.stop()
    counts = job.request_counts
    assert job.status == "completed" and counts.completed + counts.failed == 40
    assert counts.completed >= 5 and counts.completed == len(out)
    assert counts.completed == sum(r.error is None for r in result.batch)
    for row in out:
        assert row["response"]["body"]["choices"][0]["message"]["content"].startswith("echo: q")
    for row in errors:  # the connection error, or (once the dead endpoint is ejected) that
        assert row["response"] is None
        assert row["error"]["code"] in ("connection_error", "endpoint_unavailable")
        assert row["error"]["message"]


@pytest.mark.slow  # seconds of waiting: the full suite runs it
async def test_expiry_keeps_finished_results(tmp_path: Path) -> None:
    """A 4-second window over 100 requests of 0.3 s, 4 at a time (curator #226: expiry lost
    the finished results). The window leaves a busy machine time for two rounds at least."""
    with StubServer(latency_s=0.3) as stub:
        async with client(stub, tmp_path, max_concurrency=4) as c:
            started = time.monotonic()
            job = await run_file(
                c, [line(f"r{i}", "slow") for i in range(100)], completion_window="4s"
            )
            took = time.monotonic() - started
            errors = await lines_of(c, job.error_file_id)
            out = await lines_of(c, job.output_file_id)
    counts = job.request_counts
    assert job.status == "expired" and job.expired_at is not None
    assert 3 <= took < 10  # timestamps are whole seconds: the window is 3-4 s long
    assert counts.completed + counts.failed == 100 and counts.failed > 0
    # 4 at a time, 0.3 s each: what fits in the time the job took, no more
    assert 8 <= counts.completed <= 4 * (took / 0.3) + 4
    assert len(out) == counts.completed
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


async def test_counts_only_grow_and_never_exceed_total(tmp_path: Path) -> None:
    faults = [Fault(StubReply(status=400, body={"error": {"message": "bad"}}), match="bad")]
    with StubServer(latency_s=0.01, jitter_s=0.05, faults=faults) as stub:
        async with client(stub, tmp_path, max_concurrency=8) as c:
            lines = [line(f"r{i}", "bad" if i % 3 == 0 else "good") for i in range(90)]
            record = await c.files.create(jsonl(lines))
            job_id = (await c.schedule_batch(record.id)).job_id
            seen = []
            while True:
                job = await c.batches.retrieve(job_id)
                seen.append(job.request_counts)
                if job.status == "completed":
                    break
                await anyio.sleep(0.01)
    for before, after in itertools.pairwise(seen):
        assert after.completed >= before.completed and after.failed >= before.failed
    assert all(s.completed + s.failed <= 90 for s in seen)
    assert seen[-1].model_dump() == {"total": 90, "completed": 60, "failed": 30}


async def test_every_line_failing_still_ends_with_the_errors(tmp_path: Path) -> None:
    faults = [Fault(StubReply(status=401, body={"error": {"message": "no key"}}))]
    with StubServer(faults=faults) as stub:
        async with client(stub, tmp_path) as c:
            job = await run_file(c, [line(f"r{i}", "x") for i in range(5)])
            result = await c.job_result(job.id)
            errors = await lines_of(c, job.error_file_id)
    assert job.status == "completed" and job.output_file_id is None
    assert job.request_counts.model_dump() == {"total": 5, "completed": 0, "failed": 5}
    assert len(errors) == 5 and all(r.error and r.error.status_code == 401 for r in result.batch)


# ------------------------------------------------------------------------------ error records


def vllm_like_refusal(body: dict[str, Any], attempt: int) -> StubReply | None:
    """The real vLLM server's answer to ``max_tokens`` over the context (seen on the dev server)."""
    if body.get("max_tokens") == 10_000_000:
        message = (
            "max_tokens=10000000 cannot be greater than max_model_len=2048. Please request "
            "fewer output tokens. (parameter=max_tokens, value=10000000)"
        )
        error = {"message": message, "type": "BadRequestError", "param": "max_tokens", "code": 400}
        return StubReply(status=400, body={"error": error})
    return None


async def test_error_records_have_the_openai_shape(tmp_path: Path) -> None:
    from openai.types.chat import ChatCompletion

    faults = [Fault(StubReply(action="reset"), match="drop")]
    with StubServer(faults=faults, handler=vllm_like_refusal) as stub:
        async with client(stub, tmp_path, max_retries=1) as c:
            job = await run_file(
                c,
                [
                    line("good", "hello"),
                    line("huge", "hello", max_tokens=10_000_000),
                    line("dropped", "drop"),
                ],
            )
            out = await lines_of(c, job.output_file_id)
            errors = {e["custom_id"]: e for e in await lines_of(c, job.error_file_id)}
    assert job.request_counts.model_dump() == {"total": 3, "completed": 1, "failed": 2}
    assert [o["custom_id"] for o in out] == ["good"]
    ChatCompletion.model_validate(out[0]["response"]["body"])
    refusal = errors["huge"]
    assert refusal["error"] is None and refusal["response"]["status_code"] == 400
    assert set(refusal["response"]["body"]["error"]) == {"message", "type", "param", "code"}
    assert refusal["response"]["body"]["error"]["param"] == "max_tokens"
    dropped = errors["dropped"]
    assert dropped["response"] is None
    assert dropped["error"]["code"] == "connection_error" and dropped["error"]["message"]
    for row in [*out, *errors.values()]:
        response = row["response"]
        assert response is None or response["status_code"] != 200 or response["body"]["choices"]


# ------------------------------------------------------------------------------ resume


@pytest.mark.slow
async def test_leaving_the_block_pauses_and_the_next_client_resumes(tmp_path: Path) -> None:
    with StubServer(latency_s=0.02, jitter_s=0.1, record_bodies=True) as stub:
        async with client(stub, tmp_path, max_concurrency=8) as c:
            record = await c.files.create(jsonl([line(f"r{i}", f"n{i}") for i in range(300)]))
            job_id = (await c.schedule_batch(record.id)).job_id
            await until(lambda: _completed_at_least(c, job_id, 100), within=30, every=0.01)
        paused = None
        async with client(stub, tmp_path, max_concurrency=1, check_model=False) as other:
            # the same provider identity: this client takes the job up while it is open, with
            # at most one request in flight before it leaves again
            paused = await other.batches.retrieve(job_id)
        async with client(stub, tmp_path, max_concurrency=8) as c:
            with anyio.fail_after(60):
                job = await c.batches.wait(job_id)
            result = await c.job_result(job_id)
    assert paused is not None and paused.status == "in_progress"
    assert job.status == "completed" and job.request_counts.completed == 300
    assert [r.custom_id for r in result.batch] == [f"r{i}" for i in range(300)]
    texts = [b["messages"][0]["content"] for b in stub.stats.bodies]
    resent = len(texts) - len(set(texts))
    # at most what was in flight when each client left: 8 for the first, 1 for the other
    assert len(set(texts)) == 300 and resent <= 8 + 1


async def test_a_live_job_is_not_taken_over_and_can_be_cancelled_from_another_client(
    tmp_path: Path,
) -> None:
    with StubServer(latency_s=0.3, record_bodies=True) as stub:
        async with client(stub, tmp_path, max_concurrency=4) as owner:
            record = await owner.files.create(jsonl([line(f"r{i}", f"n{i}") for i in range(60)]))
            job_id = (await owner.schedule_batch(record.id)).job_id
            await until(lambda: _completed_at_least(owner, job_id, 4), within=20)
            async with client(stub, tmp_path, max_concurrency=4) as second:
                assert not second._manager().is_running_here(job_id)
                started = time.monotonic()
                await second.job_cancel(job_id)
                took = time.monotonic() - started
            job = await owner.batches.retrieve(job_id)
    assert job.status == "cancelled" and took < 5
    texts = [b["messages"][0]["content"] for b in stub.stats.bodies]
    assert len(texts) == len(set(texts))  # nothing was run twice


@pytest.mark.slow
async def test_a_job_resumed_after_its_window_expires_at_once(tmp_path: Path) -> None:
    with StubServer(latency_s=0.5) as stub:
        async with client(stub, tmp_path, max_concurrency=2) as c:
            record = await c.files.create(jsonl([line(f"r{i}", "x") for i in range(20)]))
            job_id = (await c.schedule_batch(record.id, completion_window="2s")).job_id
            await until(lambda: _completed_at_least(c, job_id, 1), within=10)
        await anyio.sleep(2.5)  # the window passes while no client runs the job
        async with client(stub, tmp_path, max_concurrency=2) as c:
            sent = stub.stats.requests
            with anyio.fail_after(10):
                job = await c.batches.wait(job_id)
            errors = await lines_of(c, job.error_file_id)
    assert job.status == "expired" and stub.stats.requests == sent
    assert job.request_counts.completed + job.request_counts.failed == 20
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


async def test_job_calls_need_an_open_client_and_match_the_protocol(tmp_path: Path) -> None:
    from batchclient import BatchInference, ClientClosedError

    c = RemoteBatchInference("http://127.0.0.1:9/v1", state_dir=tmp_path)
    assert isinstance(c, BatchInference) and c.state_dir == tmp_path
    with pytest.raises(ClientClosedError, match="async with"):
        await c.files.create(b"x")
    with pytest.raises(ClientClosedError):
        await c.batches.retrieve("batch_x")
    assert not (tmp_path / "batchclient.sqlite3").exists()  # nothing created until used


async def test_client_entered_and_closed_in_different_tasks(tmp_path: Path) -> None:
    """A pytest-asyncio session fixture enters a client in one task and closes it in another:
    closing must still pause the running job, and a new client resumes it."""
    lines = [line(f"r{i}", f"TOKEN-{i}") for i in range(40)]
    with StubServer(latency_s=0.05) as stub:
        c = client(stub, tmp_path, max_concurrency=2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.__aenter__)
        job = await c.schedule_batch((await c.files.create(jsonl(lines))).id)
        await until(lambda: stub.stats.requests >= 4)
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.__aexit__, None, None, None)
        sent = stub.stats.requests
        assert sent < 40  # paused, not finished
        async with client(stub, tmp_path) as again:
            with anyio.fail_after(60):
                done = await again.batches.wait(job.job_id)
        assert done.status == "completed" and done.request_counts.completed == 40


async def test_a_utf8_bom_is_stripped_from_the_first_custom_id(tmp_path: Path) -> None:
    with StubServer() as stub:
        async with client(stub, tmp_path) as c:
            job = await run_file(c, [line("first", "x"), line("second", "y")], bom=True)
            result = await c.job_result(job.id)
    assert job.status == "completed" and [r.custom_id for r in result.batch] == ["first", "second"]
