"""Identical greedy lines of a batch file are sent once and the answer is given to each
``custom_id``; sampled lines never are merged (against the loopback stub, real SQLite)."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import anyio

from batchclient import BatchChatCompletionResponse, RemoteBatchInference
from batchclient.testing import StubServer
from jobs_util import FAST, jsonl, line


def client(stub: StubServer, state: Path, **kw: Any) -> RemoteBatchInference:
    return RemoteBatchInference(stub.url, state_dir=state, **{**FAST, **kw})


async def run_file(c: RemoteBatchInference, lines: list[str], **options: Any) -> Any:
    record = await c.files.create(jsonl(lines))
    batch = await c.batches.create(record.id, **options)
    with anyio.fail_after(60):
        return await c.batches.wait(batch.id)


async def output_lines(c: RemoteBatchInference, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in (await c.files.content(file_id)).decode().splitlines()]


async def test_identical_greedy_lines_are_sent_once(tmp_path: Path) -> None:
    lines = [line(f"r{i}", f"q{i % 10}", temperature=0) for i in range(200)]
    with StubServer(record_bodies=True) as stub:
        async with client(stub, tmp_path) as c:  # the cache is off: merging does not need it
            job = await run_file(c, lines)
            out = await output_lines(c, job.output_file_id)
            result = await c.job_result(job.id)
    assert stub.stats.requests == 10
    assert Counter(b["messages"][0]["content"] for b in stub.stats.bodies) == {
        f"q{i}": 1 for i in range(10)
    }
    assert job.request_counts.model_dump() == {"total": 200, "completed": 200, "failed": 0}
    assert [r["custom_id"] for r in out] == [f"r{i}" for i in range(200)]
    assert len({r["id"] for r in out}) == 200  # each line its own id
    for i, row in enumerate(out):  # the same answer as the line it was merged into
        first = out[i % 10]["response"]
        assert row["response"]["body"] == first["body"]
        assert row["response"]["request_id"] == first["request_id"]
    assert isinstance(result, BatchChatCompletionResponse)
    assert [r.text for r in result.batch] == [f"echo: q{i % 10}" for i in range(200)]
    assert not any(r.cached for r in result.batch)
    # tokens count what was generated: ten answers, not two hundred
    assert job.usage.output_tokens == sum(len(f"echo: q{i}".split()) for i in range(10))


async def test_sampled_lines_are_never_merged(tmp_path: Path) -> None:
    lines = [line(f"t{i}", "same", temperature=0.8) for i in range(5)]
    lines += [line(f"d{i}", "same") for i in range(3)]  # no temperature: sampled by default
    lines += [line(f"g{i}", "same", temperature=0.0) for i in range(4)]
    with StubServer() as stub:
        async with client(stub, tmp_path) as c:
            job = await run_file(c, lines)
    assert job.request_counts.completed == 12 and stub.stats.requests == 5 + 3 + 1


async def test_merged_lines_share_a_failure_and_a_cancelled_batch_answers_every_line(
    tmp_path: Path,
) -> None:
    lines = [line(f"bad{i}", "x", temperature=0, max_tokens=-5) for i in range(3)]
    lines += [line(f"slow{i}", f"slow {i}", temperature=0) for i in range(6)]
    lines += [line(f"slowcopy{i}", f"slow {i}", temperature=0) for i in range(6)]

    def handler(body: dict[str, Any], attempt: int) -> Any:
        from batchclient.testing import StubReply

        if body.get("max_tokens") == -5:
            return StubReply(status=400, body={"error": {"message": "max_tokens must be >= 1"}})
        if body["messages"][0]["content"] in ("slow 4", "slow 5"):
            return StubReply(delay_s=30)
        return None

    with StubServer(handler=handler) as stub:
        async with client(stub, tmp_path, max_concurrency=4) as c:
            record = await c.files.create(jsonl(lines))
            batch = await c.batches.create(record.id)
            with anyio.fail_after(30):
                while (await c.batches.retrieve(batch.id)).request_counts.completed < 8:
                    await anyio.sleep(0.05)
            cancelled = await c.batches.cancel(batch.id)
            result = await c.job_result(batch.id)
    codes = [r.error.code if r.error else "ok" for r in result.batch]
    assert codes[:3] == ["invalid_request"] * 3  # one refusal, given to the three lines
    assert codes[3:7] == codes[9:13] == ["ok"] * 4
    assert codes[7:9] == codes[13:15] == ["batch_cancelled"] * 2
    assert cancelled.request_counts.model_dump() == {"total": 15, "completed": 8, "failed": 7}
    assert stub.stats.requests == 1 + 6  # the slow pair were sent, then cancelled


async def test_a_merged_line_without_its_answer_gets_it_on_the_next_batch(tmp_path: Path) -> None:
    """Results copied from an earlier batch can lack a merged line (a batch that sent both and
    failed one); the next batch gives it its line's answer without sending."""
    lines = [line(f"r{i}", f"q{i % 2}", temperature=0) for i in range(6)]
    with StubServer() as stub:
        async with client(stub, tmp_path) as c:
            first = await run_file(c, lines)
        db = sqlite3.connect(tmp_path / "batchclient.sqlite3")
        with db:  # as if lines 4 and 5 had failed in that batch: failures are not reused
            db.execute("DELETE FROM results WHERE job_id = ? AND seq >= 4", (first.id,))
        db.close()
        async with client(stub, tmp_path) as c:
            second = await run_file(c, lines, reuse_results_from=first.id)
            result = await c.job_result(second.id)
    assert stub.stats.requests == 2  # only the first batch sent anything
    assert second.request_counts.completed == 6
    assert isinstance(result, BatchChatCompletionResponse)
    assert [r.text for r in result.batch] == [f"echo: q{i % 2}" for i in range(6)]


async def test_usage_of_a_batch_reusing_results_counts_only_what_it_generated(
    tmp_path: Path,
) -> None:
    """``usage`` sums the answers generated for this batch: lines copied from
    ``reuse_results_from`` generated nothing here."""
    from batchclient.testing import Fault, StubReply

    lines = [line(f"r{i}", f"q{i} a b c", temperature=0) for i in range(6)]
    refuse_once = Fault(StubReply(status=400, body={"error": {"message": "no"}}), "q3", 1, 1)
    with StubServer(faults=[refuse_once]) as stub:
        async with client(stub, tmp_path) as c:
            first = await run_file(c, lines)
            second = await run_file(c, lines, reuse_results_from=first.id)
            result = await c.job_result(second.id)
    assert first.request_counts.failed == 1 and second.request_counts.completed == 6
    assert stub.stats.requests == 6 + 1  # the second batch sent only the refused line
    # the stub counts one token per word: "q3 a b c" in, "echo: q3 a b c" out
    assert (second.usage.input_tokens, second.usage.output_tokens) == (4, 5)
    assert second.usage.total_tokens == 9
    assert (first.usage.input_tokens, first.usage.output_tokens) == (5 * 4, 5 * 5)
    assert isinstance(result, BatchChatCompletionResponse)
    assert [r.text for r in result.batch] == [f"echo: q{i} a b c" for i in range(6)]


async def test_items_of_a_job_result_carry_their_latency(tmp_path: Path) -> None:
    """``job_result`` items carry the ``latency`` metric as the same call's items do, for every
    endpoint, after a restart too (it is stored with the row); merged lines carry their
    answer's."""
    lines = [line(f"r{i}", f"q{i % 3}", temperature=0) for i in range(6)]
    embed = [
        json.dumps(
            {
                "custom_id": f"e{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": "smollm2", "input": f"text {i}"},
            }
        )
        for i in range(3)
    ]
    with StubServer(latency_s=0.02) as stub:
        async with client(stub, tmp_path) as c:
            chat = await run_file(c, lines)
            emb = await run_file(c, embed, endpoint="/v1/embeddings")
            call = await c.batch_chat_completion("smollm2", [[{"role": "user", "content": "x"}]])
        async with client(stub, tmp_path) as c:  # read back from SQLite by a new client
            chat_result = await c.job_result(chat.id)
            emb_result = await c.job_result(emb.id)
    assert (call.batch[0].metric("latency") or 0) >= 0.02
    latencies = [r.metric("latency") for r in chat_result.batch]
    assert all(v is not None and v >= 0.02 for v in latencies), latencies
    assert latencies[3:] == latencies[:3]  # merged lines: their answer's latency
    assert all((r.metric("latency") or 0) >= 0.02 for r in emb_result.batch)


async def test_a_line_with_thousands_of_copies_answers_each_of_them(tmp_path: Path) -> None:
    """5,000 copies of one greedy line and a few lines with a copy or two: one request each,
    every copy its answer under its own id, the counts exact; the copies past the few written
    with their line's result are written after it in chunks (and on the next batch that reuses
    the results, when they were lost)."""
    lines = [line(f"c{i}", "the same question", temperature=0) for i in range(5000)]
    lines += [line(f"o{i}", f"other {i % 3}", temperature=0) for i in range(7)]
    with StubServer() as stub:
        async with client(stub, tmp_path) as c:
            job = await run_file(c, lines)
            out = await output_lines(c, job.output_file_id)
        assert stub.stats.requests == 1 + 3
        assert job.request_counts.model_dump() == {"total": 5007, "completed": 5007, "failed": 0}
        assert [r["custom_id"] for r in out] == [json.loads(x)["custom_id"] for x in lines]
        assert len({r["id"] for r in out}) == 5007
        first = out[0]["response"]
        assert all(r["response"] == first for r in out[:5000])
        assert out[5000]["response"]["body"] != first["body"]
        db = sqlite3.connect(tmp_path / "batchclient.sqlite3")
        with db:  # as if the process had died after writing the first line's result only
            db.execute("DELETE FROM results WHERE job_id = ? AND seq BETWEEN 1 AND 4999", (job.id,))
        db.close()
        async with client(stub, tmp_path) as c:
            again = await run_file(c, lines, reuse_results_from=job.id)
            out2 = await output_lines(c, again.output_file_id)
    assert stub.stats.requests == 1 + 3  # nothing sent again: the copies got their answer
    assert again.request_counts.model_dump() == {"total": 5007, "completed": 5007, "failed": 0}
    assert [r["custom_id"] for r in out2] == [r["custom_id"] for r in out]
    assert [r["response"]["body"] for r in out2] == [r["response"]["body"] for r in out]
