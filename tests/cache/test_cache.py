"""The result cache against the loopback stub (real sockets, a real SQLite file): the key
(canonical body, provider identity, repeat index), successes only, hits reported, the switch on
the client, per call and per batch, and ``batchclient cache stats | clear``."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from batchclient import BatchProgress, RemoteBatchInference, SamplingParams
from batchclient.cache import ResultCache
from batchclient.cache._key import cache_key, canonical_json, request_digest
from batchclient.cli import main
from batchclient.remote._identity import public_url, served_model_facts
from batchclient.testing import StubReply, StubServer
from batchclient.types import JsonSchemaResponseFormat, TopPSamplingStrategy
from jobs_util import FAST, jsonl, line

HI = [{"role": "user", "content": "hi"}]
GREEDY = SamplingParams(max_tokens=8)
SAMPLED = SamplingParams(max_tokens=8, strategy=TopPSamplingStrategy(temperature=0.7, top_p=0.9))


def client(stub: StubServer, state: Path, **kw: Any) -> RemoteBatchInference:
    return RemoteBatchInference(stub.url, state_dir=state, **{**FAST, **kw})


def conversations(*texts: str) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": t}] for t in texts]


# ------------------------------------------------------------------------------ the key


def test_canonical_json_sorts_keys_drops_whitespace_and_writes_integral_floats_as_integers() -> (
    None
):
    assert canonical_json({"b": 1, "a": {"d": [1.0, 2.5], "c": "é"}}) == (
        '{"a":{"c":"é","d":[1,2.5]},"b":1}'.encode()
    )
    body = {"model": "m", "messages": HI, "temperature": 0.0}
    same = {"temperature": 0, "messages": HI, "model": "m"}
    assert request_digest("/v1/chat/completions", body) == request_digest(
        "/v1/chat/completions", same
    )
    for other in ({**body, "temperature": 0.5}, {**body, "top_p": 0.9}, {**body, "seed": 1}):
        assert request_digest("/v1/chat/completions", other) != request_digest(
            "/v1/chat/completions", body
        )
    assert request_digest("/v1/completions", body) != request_digest("/v1/chat/completions", body)
    digest = request_digest("/v1/chat/completions", body)
    assert cache_key(digest, b"{}", 0) != cache_key(digest, b"{}", 1)
    assert cache_key(digest, b'{"a":1}', 0) != cache_key(digest, b'{"a":2}', 0)


def test_identity_keeps_no_secret_and_ignores_a_created_that_is_the_time_of_the_answer() -> None:
    assert (
        public_url("https://user:pw@API.example.com:8443/v1/?api_key=s3&api-version=2024&sig=x")
        == "https://api.example.com:8443/v1?api-version=2024"
    )
    now = int(time.time())
    vllm_card = {"id": "m", "created": now, "root": "/models/a", "owned_by": "vllm"}
    assert served_model_facts(vllm_card) == {"root": "/models/a", "owned_by": "vllm"}
    openai_card = {"id": "m", "created": 1_700_000_000, "owned_by": "openai"}
    assert served_model_facts(openai_card) == {"created": 1_700_000_000, "owned_by": "openai"}


# ------------------------------------------------------------------------------ calls


async def test_off_by_default_and_on_per_client_or_per_call(tmp_path: Path) -> None:
    with StubServer() as stub:
        async with client(stub, tmp_path) as c:
            await c.batch_chat_completion("smollm2", [HI], sampling_params=GREEDY)
            await c.batch_chat_completion("smollm2", [HI], sampling_params=GREEDY)
            assert stub.stats.requests == 2  # off: every call is sent
            first = await c.batch_chat_completion(
                "smollm2", [HI], sampling_params=GREEDY, cache=True
            )
            again = await c.batch_chat_completion(
                "smollm2", [HI], sampling_params=GREEDY, cache=True
            )
            assert stub.stats.requests == 3
        async with client(stub, tmp_path, cache=True) as c:  # a new client: the cache persists
            reports: list[BatchProgress] = []
            hit = await c.batch_chat_completion(
                "smollm2", [HI], sampling_params=GREEDY, progress=reports.append
            )
            await c.batch_chat_completion("smollm2", [HI], sampling_params=GREEDY, cache=False)
            assert stub.stats.requests == 4  # only the cache=False call was sent
    assert not first.batch[0].cached and again.batch[0].cached and hit.batch[0].cached
    assert again.batch[0].text == first.batch[0].text
    assert again.batch[0].metric("cached") == 1 and again.batch[0].metric("latency") is None
    assert again.batch[0].metric("completion_tokens") == first.batch[0].metric("completion_tokens")
    assert reports[-1].cache_hits == 1 and reports[-1].completed == 1
    assert reports[-1].completion_tokens == 0  # nothing was generated for this call


async def test_k_samples_of_one_prompt_are_k_entries(tmp_path: Path) -> None:
    with StubServer() as stub:
        async with client(stub, tmp_path, cache=True) as c:
            three = await c.batch_chat_completion("smollm2", [HI] * 3, sampling_params=SAMPLED)
            assert stub.stats.requests == 3 and not any(r.cached for r in three.batch)
            five = await c.batch_chat_completion("smollm2", [HI] * 5, sampling_params=SAMPLED)
            assert stub.stats.requests == 5  # samples 0-2 cached, 3 and 4 sent
            greedy = await c.batch_chat_completion("smollm2", [HI] * 3, sampling_params=GREEDY)
            assert stub.stats.requests == 8  # calls do not merge; greedy ones share one entry
            again = await c.batch_chat_completion("smollm2", [HI] * 3, sampling_params=GREEDY)
            assert stub.stats.requests == 8
    assert [r.cached for r in five.batch] == [True, True, True, False, False]
    assert [r.text for r in five.batch[:3]] == [r.text for r in three.batch]
    assert not any(r.cached for r in greedy.batch) and all(r.cached for r in again.batch)


async def test_only_successes_are_cached(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

    def handler(body: dict[str, Any], attempt: int) -> StubReply | None:
        text = body["messages"][-1]["content"]
        if text == "refused":
            return StubReply(status=400, body={"error": {"message": "no", "type": "BadRequest"}})
        if text == "flaky" and attempt == 1:
            return StubReply(status=500, body={"error": {"message": "boom"}})
        return None  # the echo answer: not JSON, so it fails the schema below

    with StubServer(handler=handler) as stub:
        async with client(stub, tmp_path, cache=True, max_retries=0) as c:
            for _ in range(3):
                out = await c.batch_chat_completion(
                    "smollm2", conversations("refused", "flaky"), sampling_params=GREEDY
                )
                off_schema = await c.batch_chat_completion(
                    "smollm2",
                    [HI],
                    sampling_params=GREEDY,
                    response_format=JsonSchemaResponseFormat(json_schema=schema),
                )
            stats = (await c._manager().result_cache()).stats()
    assert out.batch[0].error is not None and out.batch[0].error.code == "invalid_request"
    assert out.batch[1].text and out.batch[1].cached  # 500 (not kept), 200 (kept), then a hit
    assert off_schema.batch[0].error is not None
    assert off_schema.batch[0].error.code == "invalid_structured_output"
    # refused 3 times, flaky 500 then 200, off-schema 3 times: nothing failed was kept
    assert stub.stats.requests == 8 and stats.entries == 1


async def test_other_weights_under_the_same_name_miss(tmp_path: Path) -> None:
    with StubServer(model_info={"root": "/models/v1"}) as stub:
        async with client(stub, tmp_path, cache=True) as c:
            a = await c.batch_chat_completion("smollm2", [HI], sampling_params=GREEDY)
        stub.model_info = {"root": "/models/v2"}  # the server now serves other weights
        async with client(stub, tmp_path, cache=True) as c:
            b = await c.batch_chat_completion("smollm2", [HI], sampling_params=GREEDY)
        stub.model_info = {"root": "/models/v1"}
        async with client(stub, tmp_path, cache=True) as c:
            back = await c.batch_chat_completion("smollm2", [HI], sampling_params=GREEDY)
        assert stub.stats.requests == 2
    with StubServer(model_info={"root": "/models/v1"}) as other:  # another base URL
        async with client(other, tmp_path, cache=True) as c:
            elsewhere = await c.batch_chat_completion("smollm2", [HI], sampling_params=GREEDY)
        assert other.stats.requests == 1
    assert not a.batch[0].cached and not b.batch[0].cached and back.batch[0].cached
    assert not elsewhere.batch[0].cached


# ------------------------------------------------------------------------------ batches


async def _run_file(c: RemoteBatchInference, lines: list[str], **options: Any) -> Any:
    record = await c.files.create(jsonl(lines))
    batch = await c.batches.create(record.id, **options)
    with anyio.fail_after(60):
        return await c.batches.wait(batch.id)


async def test_a_batch_run_again_with_the_cache_sends_nothing(tmp_path: Path) -> None:
    lines = [line(f"r{i}", f"q{i}", temperature=0) for i in range(40)]
    with StubServer() as stub:
        async with client(stub, tmp_path, cache=True) as c:
            first = await _run_file(c, lines)
            assert stub.stats.requests == 40 and first.cache_hits == 0
            second = await _run_file(c, lines)
            result = await c.job_result(second.id)
            uncached = await _run_file(c, lines, cache=False)  # the batch's own switch
            out = (await c.files.content(second.output_file_id or "")).decode().splitlines()
    assert second.status == "completed" and second.request_counts.completed == 40
    assert second.cache_hits == 40 and second.usage.output_tokens == 0
    assert first.usage.output_tokens > 0
    assert all(r.cached for r in result.batch)
    assert [r.custom_id for r in result.batch] == [f"r{i}" for i in range(40)]
    assert uncached.cache_hits == 0 and stub.stats.requests == 80
    assert len(out) == 40 and all(second.id.removeprefix("batch_") in x for x in out)


def _cli_run(inp: Path, out: Path, stub: StubServer, state: Path, *extra: str) -> int:
    args = ["run", str(inp), "-o", str(out), "--base-url", stub.url, "--state-dir", str(state)]
    return main([*args, "--no-progress", *extra])


def test_cli_cache_and_the_cache_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(jsonl([line(f"r{i}", f"q{i}", temperature=0) for i in range(12)]))
    # another file (other ids, one more line) with the same requests: 12 hits, 1 sent
    b.write_bytes(jsonl([line(f"s{i}", f"q{i}", temperature=0) for i in range(13)]))
    with StubServer() as stub:
        assert _cli_run(a, tmp_path / "a.out", stub, state, "--cache") == 0
        assert _cli_run(b, tmp_path / "b.out", stub, state, "--cache") == 0
        assert stub.stats.requests == 13
    summary = capsys.readouterr().out
    assert "; 0 from the cache;" in summary and "; 12 from the cache;" in summary
    assert main(["cache", "stats", "--state-dir", str(state)]) == 0
    stats = capsys.readouterr().out
    assert stats.startswith("13 entries") and "smollm2: 13 entries" in stats and "12 hits" in stats
    assert main(["cache", "clear", "--model", "other", "--state-dir", str(state)]) == 0
    assert "deleted 0 " in capsys.readouterr().out
    assert main(["cache", "clear", "--older-than", "7d", "--state-dir", str(state)]) == 0
    assert "deleted 0 " in capsys.readouterr().out
    with sqlite3.connect(state / "batchclient.sqlite3") as db:  # age three entries by 8 days
        db.execute(
            "UPDATE result_cache SET created_at = created_at - 8 * 86400 "
            "WHERE key IN (SELECT key FROM result_cache ORDER BY key LIMIT 3)"
        )
    assert main(["cache", "clear", "--older-than", "7d", "--state-dir", str(state)]) == 0
    assert "deleted 3 " in capsys.readouterr().out
    assert main(["cache", "clear", "--state-dir", str(state)]) == 0
    assert "deleted 10 " in capsys.readouterr().out
    assert main(["cache", "stats", "--state-dir", str(state)]) == 0
    assert "empty" in capsys.readouterr().out
    assert main(["cache", "clear", "--older-than", "soon", "--state-dir", str(state)]) == 2


def test_a_cache_write_that_fails_never_fails_a_request(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    cache = ResultCache(state / "batchclient.sqlite3")
    cache.close()
    db = sqlite3.connect(state / "batchclient.sqlite3")
    # a trigger that makes every write to the table fail, as a full disk would
    db.execute(
        "CREATE TRIGGER full BEFORE INSERT ON result_cache "
        "BEGIN SELECT RAISE(FAIL, 'database or disk is full'); END"
    )
    db.commit()
    db.close()

    async def go() -> Any:
        with StubServer() as stub:
            async with client(stub, state, cache=True) as c:
                out = [
                    await c.batch_chat_completion("smollm2", [HI] * 40, sampling_params=SAMPLED)
                    for _ in range(2)
                ]
            return out, stub.stats.requests

    (first, second), sent = anyio.run(go)
    assert all(r.ok for r in first.batch + second.batch)
    assert sent >= 40  # the first call was sent; the second was too, bar queued entries
    reopened = ResultCache(state / "batchclient.sqlite3")
    assert reopened.stats().entries == 0  # nothing could be written, and nothing failed
    reopened.close()


def test_inline_identity_is_the_model_path_and_the_engine_args_that_change_answers() -> None:
    from batchclient.inline import VLLMProvider
    from batchclient.models import bundled_model_path

    def identity(**kw: Any) -> dict[str, Any]:
        return anyio.run(lambda: VLLMProvider(**kw).cache_identity("smollm2"))

    base = identity()
    assert base["model_path"] == str(bundled_model_path())
    # batchclient's defaults: the dtype this CPU gets, the bundled model's context
    assert base["engine_args"] == {"dtype": VLLMProvider().dtype, "max_model_len": 2048}
    assert identity(kv_cache_memory_bytes=1 << 28, max_num_seqs=8) == base  # speed, not answers
    assert identity(dtype=VLLMProvider().dtype) == base  # the default, given: the same answers
    assert identity(dtype="float16") != base and identity(seed=1) != base
    assert identity(max_model_len=1024) != base
    assert identity(tool_call_parser="hermes") != base
