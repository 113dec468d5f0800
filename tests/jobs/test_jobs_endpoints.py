"""Batch files for ``/v1/completions`` and ``/v1/embeddings`` (one endpoint per file, as OpenAI):
validated, run, resumed after SIGKILL, and written in OpenAI's output shapes (checked with the
openai SDK's types), through the API and ``batchclient run``, against the loopback stub. A batch
for an endpoint the provider does not serve is refused in ``test_capabilities.py``."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from openai.types import Completion, CreateEmbeddingResponse
from test_jobs_cli import kill_after, spawn

from batchclient import (
    BatchCompletionResponse,
    BatchEmbeddingsResponse,
    Endpoint,
    ErrorCode,
    RemoteBatchInference,
)
from batchclient.cli import main
from batchclient.jobs import validate_batch_file
from batchclient.testing import Fault, StubReply, StubServer
from jobs_util import FAST, jsonl, read_jsonl

COMPLETIONS, EMBEDDINGS = Endpoint.completions.value, Endpoint.embeddings.value


def request_line(cid: str, url: str, **body: Any) -> str:
    return json.dumps(
        {"custom_id": cid, "method": "POST", "url": url, "body": {"model": "smollm2", **body}}
    )


def completion_line(cid: str, prompt: Any, **body: Any) -> str:
    return request_line(cid, COMPLETIONS, prompt=prompt, **{"max_tokens": 4, **body})


def embedding_line(cid: str, value: Any, **body: Any) -> str:
    return request_line(cid, EMBEDDINGS, input=value, **body)


def errors_of(lines: list[str], endpoint: str) -> list[tuple[int | None, str, str | None]]:
    report = validate_batch_file(io.BytesIO(jsonl(lines)), endpoint=endpoint)
    return [(e.line, e.code, e.param) for e in report.errors]


def test_completions_and_embeddings_lines_are_validated_per_endpoint() -> None:
    good = [completion_line("a", "text"), completion_line("b", [1, 2]), completion_line("c", ["x"])]
    assert errors_of(good, COMPLETIONS) == []
    bad = [
        request_line("a", COMPLETIONS, max_tokens=3),  # no prompt
        completion_line("b", []),
        completion_line("c", [1.5]),
        completion_line("d", "ok", stream=True),
        json.dumps(
            {
                "custom_id": "e",
                "method": "POST",
                "url": EMBEDDINGS,
                "body": {"model": "smollm2", "input": "x"},
            }
        ),
    ]
    assert errors_of(bad, COMPLETIONS) == [
        (1, "missing_required_parameter", "body.prompt"),
        (2, "invalid_request", "body.prompt"),
        (3, "invalid_request", "body.prompt"),
        (4, "streaming_unsupported", "body.stream"),
        (5, "invalid_url", "url"),
    ]
    assert (
        errors_of([embedding_line("a", "x"), embedding_line("b", ["x", [3, 4]])], EMBEDDINGS) == []
    )
    assert errors_of(
        [
            embedding_line("a", ""),
            embedding_line("b", ["x", ""]),
            embedding_line("c", "x", encoding_format="hex"),
            completion_line("d", "x"),
        ],
        EMBEDDINGS,
    ) == [
        (1, "invalid_request", "body.input"),
        (2, "invalid_request", "body.input"),
        (3, "invalid_request", "body.encoding_format"),
        (4, "invalid_url", "url"),
    ]


async def run_batch(client: RemoteBatchInference, lines: list[str], endpoint: str) -> Any:
    record = await client.files.create(jsonl(lines))
    batch = await client.batches.create(record.id, endpoint=endpoint)
    with anyio.fail_after(60):
        return await client.batches.wait(batch.id)


async def test_a_completions_batch_writes_openai_completion_lines(tmp_path: Path) -> None:
    faults = [Fault(StubReply(status=400, body={"error": {"message": "refused"}}), match="refuse")]
    with StubServer(faults=faults) as stub:
        async with RemoteBatchInference(stub.url, state_dir=tmp_path, **FAST) as client:
            lines = [completion_line(f"r{i}", f"prompt {i}") for i in range(20)]
            lines.append(completion_line("bad", "please refuse"))
            lines.append(completion_line("ids", [5, 6, 7], echo=True, logprobs=1, max_tokens=0))
            batch = await run_batch(client, lines, COMPLETIONS)
            out = [
                json.loads(x)
                for x in (await client.files.content(batch.output_file_id)).splitlines()
            ]
            err = [
                json.loads(x)
                for x in (await client.files.content(batch.error_file_id)).splitlines()
            ]
            result = await client.job_result(batch.id)
    assert batch.endpoint == COMPLETIONS and batch.request_counts.completed == 21
    for row in out[:-1]:  # (the SDK's type has no null logprob, which an echoed prompt starts with)
        Completion.model_validate(row["response"]["body"])
    assert [r["custom_id"] for r in err] == ["bad"] and err[0]["response"]["status_code"] == 400
    assert isinstance(result, BatchCompletionResponse)
    assert result.batch[0].content == "echo: prompt 0" and result.batch[20].error is not None
    echoed = out[-1]["response"]["body"]["choices"][0]
    assert (
        echoed["logprobs"]["token_logprobs"][0] is None and len(echoed["logprobs"]["tokens"]) == 3
    )


async def test_an_embeddings_batch_writes_openai_embedding_lines(tmp_path: Path) -> None:
    with StubServer() as stub:
        async with RemoteBatchInference(stub.url, state_dir=tmp_path, **FAST) as client:
            lines = [embedding_line(f"e{i}", f"text {i}") for i in range(10)]
            lines.append(embedding_line("many", ["a", "b", "c"], encoding_format="base64"))
            batch = await run_batch(client, lines, EMBEDDINGS)
            out = [
                json.loads(x)
                for x in (await client.files.content(batch.output_file_id)).splitlines()
            ]
            result = await client.job_result(batch.id)
    assert batch.request_counts.completed == 11 and batch.error_file_id is None
    for row in out[:-1]:
        CreateEmbeddingResponse.model_validate(row["response"]["body"])
    # base64 (the SDK's type holds floats: the SDK decodes base64 itself)
    many = out[-1]["response"]["body"]["data"]
    assert len(many) == 3 and all(isinstance(d["embedding"], str) for d in many)
    assert isinstance(result, BatchEmbeddingsResponse) and len(result.batch[0].vector) == 8


def sent(stub: StubServer) -> Counter[str]:
    return Counter(str(b.get("prompt")) for b in stub.stats.bodies)


@pytest.mark.slow
def test_batchclient_run_takes_a_completions_file_and_resumes_after_sigkill(tmp_path: Path) -> None:
    inp, out, state = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "state"
    n = 400  # far from done when it is killed, however slowly the kill follows the count
    inp.write_bytes(jsonl([completion_line(f"r{i}", f"n{i}") for i in range(n)]))
    args = ["run", str(inp), "-o", str(out), "--state-dir", str(state), "--max-concurrency", "8",
            "--no-progress"]  # fmt: skip
    with StubServer(latency_s=0.02, jitter_s=0.05, record_bodies=True) as stub:
        proc = spawn([*args, "--base-url", stub.url])
        at_kill = kill_after(proc, state, 60)
        assert main([*args, "--base-url", stub.url]) == 0
    rows = read_jsonl(out)
    assert sorted(r["custom_id"] for r in rows) == sorted(f"r{i}" for i in range(n))
    assert all(r["response"]["body"]["object"] == "text_completion" for r in rows)
    counts = sent(stub)
    assert 60 <= at_kill < n and len(counts) == n and sum(counts.values()) - n <= 8


def test_batchclient_run_takes_an_embeddings_file(tmp_path: Path) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(jsonl([embedding_line(f"e{i}", f"text {i}") for i in range(5)]))
    with StubServer() as stub:
        code = main(["run", str(inp), "-o", str(out), "--base-url", stub.url, "--state-dir",
                     str(tmp_path / "state"), "--no-progress"])  # fmt: skip
    assert code == 0
    rows = read_jsonl(out)
    assert [r["response"]["body"]["object"] for r in rows] == ["list"] * 5
    assert ErrorCode.invalid_url  # the mixed-file case is covered by validation above
