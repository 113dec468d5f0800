"""Prompt-cache tokens reported everywhere: per item (the ``cached_tokens`` metric), per call
(``BatchProgress.cached_tokens``), per job (``usage.input_tokens_details.cached_tokens``), in
``batchclient serve``'s ``/metrics`` (``batchclient_tokens_total{kind="cached"}``) and on its
status page. Against a loopback stub whose prefix cache reports a prefix served before as
cached (one token per word), so exactly the first of a few-shot group is a miss."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchclient import BatchProgress, RemoteBatchInference
from batchclient.testing import StubServer
from server_util import KEY_A, http, sdk, served, wait_batch

SHOTS = [
    {"role": "system", "content": "Answer with one number only, please."},  # 6 words
    {"role": "user", "content": "What is 2 + 2?"},  # 5 words
    {"role": "assistant", "content": "4"},  # 1 word
]
PREFIX_WORDS = 12


def few_shot(i: int) -> list[dict[str, str]]:
    return [*SHOTS, {"role": "user", "content": f"What is {i} + {i}?"}]


async def test_items_and_the_call_report_the_cached_prompt_tokens() -> None:
    reports: list[BatchProgress] = []
    with StubServer(prefix_cache=True) as stub:
        async with RemoteBatchInference(stub.url, max_concurrency=1) as client:
            result = await client.batch_chat_completion(
                "smollm2", [few_shot(i) for i in range(6)], progress=reports.append
            )
            # a one-message conversation has no prefix: nothing cached, still reported
            lone = await client.batch_chat_completion(
                "smollm2", [[{"role": "user", "content": "hi"}]]
            )
    assert not result.errors
    cached = [r.metric("cached_tokens") for r in result.batch]
    assert cached == [0.0] + [float(PREFIX_WORDS)] * 5  # one at a time: the first is a miss
    assert reports[-1].cached_tokens == 5 * PREFIX_WORDS
    assert reports[-1].prompt_tokens > reports[-1].cached_tokens
    assert lone.batch[0].metric("cached_tokens") == 0.0


async def test_without_a_report_there_is_no_metric() -> None:
    with StubServer() as stub:
        async with RemoteBatchInference(stub.url) as client:
            result = await client.batch_chat_completion("smollm2", [few_shot(1)])
    assert result.batch[0].metric("cached_tokens") is None
    assert result.batch[0].metric("prompt_tokens") is not None


def few_shot_lines(n: int) -> bytes:
    lines = [
        {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "smollm2", "messages": few_shot(i)}}
        for i in range(n)
    ]  # fmt: skip
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


async def test_a_job_sums_the_cached_tokens_in_its_usage(tmp_path: Path) -> None:
    with StubServer(prefix_cache=True) as stub:
        async with RemoteBatchInference(stub.url, state_dir=tmp_path / "state") as client:
            record = await client.files.create(few_shot_lines(8))
            batch = await client.batches.create(record.id)
            with anyio.fail_after(60):
                batch = await client.batches.wait(batch.id)
    assert batch.request_counts is not None and batch.request_counts.completed == 8
    # requests in flight together may all miss before the first answer: the stub marks a
    # prefix seen when it answers, so exactly one answer is a miss
    assert batch.usage.input_tokens_details.cached_tokens == 7 * PREFIX_WORDS
    assert batch.usage.input_tokens > batch.usage.input_tokens_details.cached_tokens


def scrape(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.slow
def test_serve_reports_cached_tokens_in_usage_metrics_and_the_status_page(
    tmp_path: Path,
) -> None:
    with StubServer(prefix_cache=True) as stub, served(stub.url, tmp_path / "state") as url:
        client = sdk(url)
        upload = client.files.create(file=("in.jsonl", few_shot_lines(6)), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done: Any = wait_batch(client, batch.id)
        assert done.status == "completed"
        assert done.usage.input_tokens_details.cached_tokens == 5 * PREFIX_WORDS
        samples = scrape(http(url).get("/metrics").text)
        kind = {"kind": "cached"}
        assert samples[("batchclient_tokens_total", frozenset(kind.items()))] == 5 * PREFIX_WORDS
        for other in ("cache_write", "reasoning"):
            assert samples[("batchclient_tokens_total", frozenset({"kind": other}.items()))] == 0
        page = http(url).get("/", headers={"Authorization": f"Bearer {KEY_A}"}).text
        assert batch.id in page
        assert f"({5 * PREFIX_WORDS})" in page
