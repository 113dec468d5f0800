"""The result cache, merged lines and dry runs on the real providers: the vLLM OpenAI server
(behind a counting proxy, so what was sent is counted) and the in-process engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from batchclient import RemoteBatchInference, SamplingParams, VLLMBatchInference
from batchclient.jobs import JobManager
from batchclient.jobs._estimate import estimate_file
from batchclient.models import bundled_model_path
from batchclient.testing import CountingProxy
from batchclient.types import TopPSamplingStrategy
from jobs_util import jsonl, line

GREEDY = SamplingParams(max_tokens=12)
SAMPLED = SamplingParams(max_tokens=12, strategy=TopPSamplingStrategy(temperature=0.9, top_p=0.95))


def convos(*texts: str) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": t}] for t in texts]


@pytest.mark.server
async def test_remote_cache_identity_names_the_weights_and_a_second_call_sends_nothing(
    vllm_url: str, tmp_path: Path
) -> None:
    with CountingProxy(vllm_url) as proxy:
        async with RemoteBatchInference(proxy.url, state_dir=tmp_path, cache=True) as c:
            identity = await c.provider.cache_identity("smollm2")
            questions = convos("Name a colour.", "Name a fruit.", "Name a city.")
            first = await c.batch_chat_completion("smollm2", questions, sampling_params=GREEDY)
            sent = proxy.requests
            again = await c.batch_chat_completion("smollm2", questions, sampling_params=GREEDY)
            samples = await c.batch_chat_completion(
                "smollm2", convos("Say a word.") * 2, sampling_params=SAMPLED
            )
            assert proxy.requests == sent + 2  # two samples are two requests, two entries
            more = await c.batch_chat_completion(
                "smollm2", convos("Say a word.") * 3, sampling_params=SAMPLED
            )
            assert proxy.requests == sent + 3
    # vLLM reports the model path as root; its "created" is the time of the listing: left out
    served = identity["served"]
    assert served["root"] and await anyio.Path(served["root"]).is_dir()
    assert "created" not in served
    assert sent == 3 and all(r.cached for r in again.batch)
    assert [r.text for r in again.batch] == [r.text for r in first.batch]
    assert [r.cached for r in more.batch] == [True, True, False]
    assert [r.text for r in more.batch[:2]] == [r.text for r in samples.batch]


@pytest.mark.server
async def test_remote_dry_run_counts_with_the_served_models_local_tokenizer(
    vllm_url: str, tmp_path: Path
) -> None:
    from providers import prompt_tokens

    texts = ["What is the capital of France?", "Write a haiku about the sea."]
    path = tmp_path / "in.jsonl"
    path.write_bytes(jsonl([line(f"r{i}", t) for i, t in enumerate(texts)]))
    with CountingProxy(vllm_url) as proxy:
        async with RemoteBatchInference(proxy.url, state_dir=tmp_path / "state") as c:
            est = await estimate_file(path, c.provider, None)
        assert proxy.requests == 0
    assert not est.prompt_tokens_estimated and est.tokenizer
    assert est.prompt_tokens == sum(prompt_tokens([{"role": "user", "content": t}]) for t in texts)


@pytest.mark.engine
async def test_inline_batches_merge_lines_and_answer_from_the_cache(
    inline_client: VLLMBatchInference, tmp_path: Path
) -> None:
    lines = [line(f"r{i}", f"Count to {i % 3}.", temperature=0) for i in range(9)]
    identity = await inline_client.provider.cache_identity("smollm2")
    # a second manager over the session's engine, with its own state directory
    async with JobManager(tmp_path, provider=inline_client.provider, cache=True) as manager:

        async def run() -> Any:
            record = await manager.files.create(jsonl(lines))
            batch = await manager.batches.create(record.id)
            with anyio.fail_after(300):
                done = await manager.batches.wait(batch.id)
            return done, await manager.result(batch.id)

        first, first_result = await run()
        second, second_result = await run()
    assert identity["model_path"] == str(bundled_model_path())
    # the KV cache size is left out; the dtype the hardware chose changes answers: it is in
    dtype = inline_client.provider.dtype
    assert identity["engine_args"] == {"dtype": dtype, "max_model_len": 2048}
    assert first.request_counts.completed == 9 and first.cache_hits == 0
    assert first.usage.output_tokens > 0
    assert [r.text for r in first_result.batch[3:]] == [r.text for r in first_result.batch[:6]]
    assert second.cache_hits == 3 and second.usage.output_tokens == 0  # 3 distinct requests
    assert all(r.cached for r in second_result.batch)
    assert [r.text for r in second_result.batch] == [r.text for r in first_result.batch]
