"""``RayBatchInference`` on a real local Ray cluster (the session's ``ray_client``, conftest):
two replicas of the bundled model, each an engine with a small KV cache bound to its own core.
Ordered results, per-item errors, cancellation, every endpoint the inline engine serves
(completions and scoring with the inline engine's answers, embeddings on one pooling replica
with the vLLM server's), the Ray Data adapter, a job resumed after its client process is
killed, and a replica killed mid-batch (last: it leaves one replica). Start-up takes one to
several minutes on 2 busy cores."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from batchclient import (
    ConfigurationError,
    ModelNotFoundError,
    RayBatchInference,
    RemoteBatchInference,
    SamplingParams,
    VLLMBatchInference,
)
from batchclient._core.scoring import loglikelihood_requests
from batchclient.types import Endpoint
from jobs_util import done_in_db, line, read_jsonl, wait_sync

# engine start-up alone takes minutes on 2 busy cores: more than the default 600 s per test
pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

MODEL = "smollm2"
KV = 256 << 20


def conversations(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Count from {i} to {i + 3}."}] for i in range(n)]


async def idle(client: RayBatchInference) -> list[tuple[int, int, int]]:
    """Each replica's engine counts after a tiny probe per replica (the engine core reports
    its counts with each step's output, so the probe makes the report fresh)."""
    hi = [[{"role": "user", "content": "Hi"}]] * 4
    await client.batch_chat_completion(MODEL, hi, SamplingParams(max_tokens=2))
    return await client.provider.engine_counts()


async def test_replicas_bind_their_own_cores(ray_client: RayBatchInference) -> None:
    infos = [h.info for h in ray_client.provider.handles]
    cores = [tuple(i.record["cores"]) for i in infos]
    assert len(set(cores)) == 2 and all(len(c) == 1 for c in cores)  # one core each
    assert sorted(i.binding for i in infos) == sorted(",".join(map(str, c)) for c in cores)
    assert all(i.record["shm"] for i in infos)  # their message queues are on record


async def test_ordered_results_and_per_item_errors(ray_client: RayBatchInference) -> None:
    batch = conversations(24)
    batch.insert(7, [{"role": "user", "content": "word " * 1500}])  # over max_model_len 1024
    result = await ray_client.batch_chat_completion(
        MODEL,
        batch,
        SamplingParams(max_tokens=8),
        custom_ids=[f"c{i}" for i in range(len(batch))],
    )
    assert [r.custom_id for r in result.batch] == [f"c{i}" for i in range(25)]
    bad = result.batch[7]
    assert bad.error is not None and bad.error.code == "context_length_exceeded"
    assert all(r.error is None and r.text for i, r in enumerate(result.batch) if i != 7)
    # both replicas served: the dispatcher spread the batch over them
    served = {s.url: s.succeeded for s in ray_client.provider._dispatcher.stats()}  # type: ignore[union-attr]
    assert all(n > 0 for n in served.values()), served


async def test_cancellation_aborts_in_the_actors(ray_client: RayBatchInference) -> None:
    with anyio.move_on_after(3):
        await ray_client.batch_chat_completion(
            MODEL, conversations(16), SamplingParams(max_tokens=900, ignore_eos=True)
        )
    deadline = time.monotonic() + 30
    counts = await idle(ray_client)
    while any(c != (0, 0, 0) for c in counts) and time.monotonic() < deadline:
        await anyio.sleep(0.5)
        counts = await idle(ray_client)
    assert counts == [(0, 0, 0), (0, 0, 0)]


async def test_completions_are_the_inline_engines(
    ray_client: RayBatchInference, inline_client: VLLMBatchInference
) -> None:
    """Greedy, one prompt per call on both (an engine running one request computes the same
    numbers whatever else it served: bfloat16 results move with the batch around them)."""
    assert ray_client.provider.endpoints == {Endpoint.chat_completions, Endpoint.completions}
    greedy = SamplingParams(max_tokens=8)
    for prompt in ["The capital of France is", "1, 2, 3,", "Once upon a time"]:
        ours = await ray_client.batch_completion(MODEL, [prompt], greedy)
        theirs = await inline_client.batch_completion(MODEL, [prompt], greedy)
        assert ours.batch[0].error is None and ours.batch[0].content
        assert ours.batch[0].content == theirs.batch[0].content, prompt


async def test_scoring_uses_the_engines_tokenizer_and_gives_the_inline_scores(
    ray_client: RayBatchInference, inline_client: VLLMBatchInference
) -> None:
    ray_tok = await ray_client.provider.tokenizer(MODEL)
    inline_tok = await inline_client.provider.tokenizer(MODEL)
    texts = ["The capital of France is Paris", " Paris", "héllo wörld"]
    assert await ray_tok.encode(texts) == await inline_tok.encode(texts)
    ray_info, inline_info = await ray_tok.info(), await inline_tok.info()
    assert (ray_info.bos_token_id, ray_info.eos_token_id, ray_info.max_model_len) == (
        inline_info.bos_token_id,
        inline_info.eos_token_id,
        1024,  # the replicas' own context, not the inline engine's 2048
    )
    with pytest.raises(ModelNotFoundError):
        await ray_client.provider.tokenizer("nope")

    pairs: list[Any] = [
        ("The capital of France is", " Paris"),
        ("The capital of France is", " a banana"),
        ([504, 3575, 282, 4649, 314], [7042]),
    ]
    ours = await ray_client.batch_loglikelihood(MODEL, pairs)
    theirs = await inline_client.batch_loglikelihood(MODEL, pairs)
    rolling = ["One, two, three, four, five, six."]
    ours_rolling = await ray_client.batch_loglikelihood_rolling(MODEL, rolling)
    theirs_rolling = await inline_client.batch_loglikelihood_rolling(MODEL, rolling)
    # bfloat16 scores move with the batch around them (a few hundredths here): within a
    # tolerance, token counts exact
    for mine, other in zip(
        ours.batch + ours_rolling.batch, theirs.batch + theirs_rolling.batch, strict=True
    ):
        assert mine.error is None and other.error is None
        assert mine.num_tokens == other.num_tokens
        assert mine.logprob == pytest.approx(other.logprob, rel=0.02, abs=0.05)
    paris, banana = ours.batch[0].logprob, ours.batch[1].logprob
    assert paris is not None and banana is not None and paris > banana
    # a one-token continuation, scored on a replica as on the inline engine: by a generation
    # request over the context, whose answer holds the continuation's position only
    [one_token] = loglikelihood_requests(MODEL, [pairs[2]], 1024, None)
    result = await ray_client.provider.execute(one_token)
    assert result.body is not None
    assert result.body["choices"][0]["prompt_logprobs"][:-1] == [None] * 5
    # and a continuation of several tokens by teacher forcing: the continuation's positions only
    forced = (pairs[2][0], [7042, 28, 3575])
    [several] = loglikelihood_requests(MODEL, [forced], 1024, None)
    result = await ray_client.provider.execute(several)
    assert result.error is None and result.body is not None
    entries = result.body["choices"][0]["prompt_logprobs"]
    assert entries[:5] == [None] * 5
    assert all(str(t) in e for t, e in zip(forced[1], entries[5:], strict=True))

    # what the result cache and dry runs ask: the inline provider's answers, as "ray"
    inline_identity = await inline_client.provider.cache_identity(MODEL)
    identity = await ray_client.provider.cache_identity(MODEL)
    assert identity["provider"] == "ray" and identity["model_path"] == inline_identity["model_path"]
    path = await ray_client.provider.tokenizer_path(MODEL)
    assert path is not None and path == await inline_client.provider.tokenizer_path(MODEL)


async def test_pooling_replicas_embed_as_the_vllm_server(
    ray_client: RayBatchInference, pooling_url: str, tmp_path: Path
) -> None:
    """One embedding replica on the same cluster (its own client, closed at the end so the
    resume test below finds a free Ray CPU), against the session's vLLM server in pooling mode
    (the inline pooling engine is checked against the same server in
    tests/inline/test_embeddings.py)."""
    texts = ["A cat sat on the mat.", "A kitten rested on the rug.", "Stock prices fell today."]
    async with RayBatchInference(
        replicas=1,
        runner="pooling",
        convert="embed",
        max_model_len=1024,
        kv_cache_memory_bytes=KV,
        max_concurrency=64,
        cores_per_replica=1,
    ) as pooled:
        assert pooled.provider.endpoints == {Endpoint.embeddings}
        ours = await pooled.batch_embeddings(MODEL, texts)
        with pytest.raises(ConfigurationError, match="/v1/completions"):
            await pooled.batch_completion(MODEL, ["x"])
    # one input per request: the server counts each input's tokens, as a replica does
    async with RemoteBatchInference(
        pooling_url, state_dir=tmp_path, embedding_group_size=1
    ) as server:
        theirs = await server.batch_embeddings(MODEL, texts)
    assert not ours.errors and not theirs.errors
    for mine, other in zip(ours.batch, theirs.batch, strict=True):
        # bfloat16 rounding moves with the batching, not the vector
        # (tests/inline/test_embeddings.py)
        assert len(mine.vector) == 576 and cosine(mine.vector, other.vector) >= 0.999
        assert mine.metric("prompt_tokens") == other.metric("prompt_tokens")


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


async def test_ray_data_adapter_gives_every_row_an_answer_or_an_error(
    ray_client: RayBatchInference,
) -> None:
    import ray.data

    from batchclient.integrations.ray_data import infer

    rows: list[dict[str, Any]] = [
        {"id": i, "messages": [{"role": "user", "content": f"Say {i}."}]} for i in range(64)
    ]
    rows[10]["messages"] = [{"role": "user", "content": "word " * 1500}]  # too long
    dataset = ray.data.from_items(rows)
    out = infer(dataset, ray_client, sampling={"max_tokens": 4}, batch_size=16).take_all()
    by_id = {r["id"]: r for r in out}
    assert sorted(by_id) == list(range(64))
    assert by_id[10]["error_code"] == "context_length_exceeded" and by_id[10]["answer"] is None
    ok = [r for i, r in by_id.items() if i != 10]
    assert all(r["error_code"] is None and r["answer"] for r in ok)
    assert all(0 < r["completion_tokens"] <= 4 for r in ok)


@pytest.mark.heavy
def test_a_job_resumes_after_its_client_process_is_killed(
    ray_client: RayBatchInference, tmp_path: Path
) -> None:
    """``batchclient run --provider ray`` on this test's Ray cluster (its own replica), killed
    with SIGKILL mid-run; the same command again finishes the job, every line exactly once."""
    inp = tmp_path / "in.jsonl"
    n = 48
    inp.write_text("\n".join(line(f"r{i}", f"Write about {i}.", max_tokens=48) for i in range(n)))
    out, state = tmp_path / "out.jsonl", tmp_path / "state"
    cmd = [
        sys.executable, "-m", "batchclient.cli", "run", str(inp), "-o", str(out),
        "--state-dir", str(state), "--provider", "ray", "--address", "auto",
        "--replicas", "1", "--max-concurrency", "4", "--no-progress",
        "--engine-arg", f"kv_cache_memory_bytes={KV}", "--engine-arg", "max_model_len=1024",
        "--cores-per-replica", "1",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}
    first = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        wait_sync(lambda: done_in_db(state) >= 4, timeout=540, every=0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    done_before = done_in_db(state)
    assert done_before < n, "the job finished before it could be killed"
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resum" in second.stderr  # it took the unfinished job up, not a new one
    ids = Counter(row["custom_id"] for row in read_jsonl(out))
    assert ids == Counter({f"r{i}": 1 for i in range(n)})
    assert all(row["error"] is None for row in read_jsonl(out))


async def test_a_killed_replica_loses_no_item_and_leaves_no_shared_memory(
    ray_client: RayBatchInference,
) -> None:
    import ray

    provider = ray_client.provider
    victim = provider.handles[0]
    shm = [Path(p) for p in victim.info.record["shm"]]
    assert shm and all(p.exists() for p in shm)
    batch = conversations(32)

    def in_flight_on_victim() -> int:
        stats = {s.url: s for s in provider._dispatcher.stats()}  # type: ignore[union-attr]
        lane = stats.get("ray-replica-0")  # a replica's lane shows once it was dispatched to
        return 0 if lane is None else lane.in_flight

    async def kill_soon() -> None:
        with anyio.fail_after(120):  # mid-batch: once the victim holds requests
            while in_flight_on_victim() == 0:
                await anyio.sleep(0.05)
        await anyio.sleep(0.5)  # past their prefill, into generation
        ray.kill(victim.actor, no_restart=True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(kill_soon)
        result = await ray_client.batch_chat_completion(
            MODEL, batch, SamplingParams(max_tokens=96, ignore_eos=True)
        )
    assert [r.error for r in result.batch] == [None] * 32
    assert all(r.text for r in result.batch)
    stats = {s.url: s for s in provider._dispatcher.stats()}  # type: ignore[union-attr]
    assert stats["ray-replica-0"].ejected
    # the scoring calls' tokenizer is asked of the replica still in service
    scored = await ray_client.batch_loglikelihood(MODEL, [("One, two,", " three")])
    assert scored.batch[0].error is None and (scored.batch[0].num_tokens or 0) >= 1
    deadline = time.monotonic() + 60
    while any(p.exists() for p in shm) and time.monotonic() < deadline:
        await anyio.sleep(0.5)
    assert not [p for p in shm if p.exists()]
    record = victim.info.record
    survivors = [e for e in record["engine"] if _alive(e["pid"], e["create_time"])]
    assert survivors == []


def _alive(pid: int, create_time: float) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        return bool(abs(proc.create_time() - create_time) < 0.01 and proc.is_running())
    except psutil.Error:
        return False
