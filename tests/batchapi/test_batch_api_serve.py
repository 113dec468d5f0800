"""``BatchAPIBatchInference`` against a real ``batchclient serve`` on loopback (uvicorn serving
``batchclient.server.create_app`` over a ``RemoteProvider`` pointed at the chat stub, through
``batchclient.testing.AppServer``): a split into several remote batches, a client SIGKILLed
while it waits then re-attached with no second submission, and cancel. Ordered results and
per-item errors of every call kind are the ``batch-api`` row of ``test_capabilities.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from batchclient import BatchAPIBatchInference, make_provider
from batchclient.batchapi._openai import OpenAIBackend
from batchclient.remote import RemoteProvider, RetryPolicy
from batchclient.testing import AppServer, Fault, StubReply, StubServer
from jobs_util import jsonl, line, until, wait_sync

server_module = pytest.importorskip("batchclient.server")

KEY = "sk-serve-test-0123456789abcdef"
FAST = RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)
REFUSED = StubReply(
    status=400,
    body={"error": {"message": "refused", "type": "invalid_request_error", "code": None}},
)


@dataclass
class Serve:
    url: str
    stub: StubServer
    state: Path

    def sent(self) -> Counter[str]:
        """How many times the stub received each prompt."""
        return Counter(b["messages"][0]["content"] for b in self.stub.stats.bodies)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """A real ``batchclient serve`` app (one API key) over the chat stub, on loopback."""
    with StubServer(
        latency_s=0.01, record_bodies=True, faults=[Fault(REFUSED, match="BAD")]
    ) as stub:
        # 4 in flight: the server takes a while over a batch, so a client can die waiting
        provider = RemoteProvider(stub.url, max_concurrency=4, max_retries=0, retry=FAST)
        app = server_module.create_app(provider, state_dir=tmp_path / "server", api_keys=[KEY])
        with AppServer(app) as url:
            yield Serve(url + "/v1", stub, tmp_path / "server")


def client(serve: Serve, state: Path, **kwargs: Any) -> BatchAPIBatchInference:
    return BatchAPIBatchInference(
        serve.url, api_key=KEY, poll_interval_s=0.05, retry=FAST, state_dir=state, **kwargs
    )


def convo(texts: list[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": t}] for t in texts]


async def remote_batches(serve: Serve) -> list[dict[str, Any]]:
    """The server's batches, as the openai SDK lists them."""
    sdk = openai.AsyncOpenAI(base_url=serve.url, api_key=KEY, max_retries=0)
    try:
        page = await sdk.batches.list(limit=100)
        return [b.model_dump() for b in page.data]
    finally:
        await sdk.close()


async def test_split_into_several_remote_batches(serve: Serve, tmp_path: Path) -> None:
    async with client(serve, tmp_path, max_lines=4) as c:
        result = await c.batch_chat_completion("smollm2", convo([f"m{i}" for i in range(10)]))
        batches = await remote_batches(serve)
        for b in batches:  # what a client that lost a create's answer looks for, it finds
            marks = {k: b["metadata"][k] for k in ("batchclient_job", "batchclient_part")}
            assert isinstance(c.provider.backend, OpenAIBackend)
            found = await c.provider.backend.find(b["input_file_id"], marks, 0, 0.0)
            assert found == b["id"]
    assert [i.completion_message.content for i in result.batch if i.completion_message] == [
        f"echo: m{i}" for i in range(10)
    ]
    assert len(batches) == 3
    assert sorted(b["request_counts"]["total"] for b in batches) == [2, 4, 4]
    assert all(b["status"] == "completed" for b in batches)


async def test_lines_rate_limited_twice_are_answered_by_the_third_remote_batch(
    tmp_path: Path,
) -> None:
    """The server runs its upstream without retries (``batchclient serve --max-retries 0``),
    and the upstream answers some lines 429 twice: the client resubmits just those lines, in
    a new remote batch each time, and the third answers them."""
    busy = StubReply(status=429, body={"error": {"message": "slow down", "type": "rate_limit"}})
    with StubServer(record_bodies=True, faults=[Fault(busy, match="BUSY", last_attempt=2)]) as stub:
        provider = make_provider("remote", base_url=stub.url, max_retries=0)
        app = server_module.create_app(provider, state_dir=tmp_path / "server", api_keys=[KEY])
        with AppServer(app) as url:
            serve = Serve(url + "/v1", stub, tmp_path / "server")
            prompts = [f"q{i}" + (" BUSY" if i % 3 == 0 else "") for i in range(9)]
            async with client(serve, tmp_path / "client", max_attempts=3) as c:
                result = await c.batch_chat_completion("smollm2", convo(prompts))
            batches = await remote_batches(serve)
    assert [i.error for i in result.batch] == [None] * 9
    texts = [i.completion_message.content for i in result.batch if i.completion_message]
    assert texts == [f"echo: {p}" for p in prompts]
    assert sorted(b["request_counts"]["total"] for b in batches) == [3, 3, 9]
    sent = serve.sent()  # the answered lines went once; the rate-limited ones three times
    assert {p: sent[p] for p in prompts} == {p: 3 if "BUSY" in p else 1 for p in prompts}


@pytest.mark.slow
def test_lm_eval_scores_text_through_the_batch_api_with_a_local_tokenizer(
    serve: Serve, tmp_path: Path
) -> None:
    """``batchclient lm-eval --provider batch-api --tokenizer DIR``: loglikelihood requests go as
    ``/v1/completions`` batch lines of token ids asking for the prompt's log-probabilities
    (``echo`` + ``logprobs``, as the remote provider sends them), through the server to its
    upstream, and come back as lm-eval's scores."""
    from lm_eval.api.instance import Instance

    from batchclient.integrations.lm_eval import BatchClientLM
    from batchclient.models import bundled_model_path
    from batchclient.testing._stub_answers import token_logprob
    from providers import tokenizer

    pairs = [("The capital of France is", " Paris"), ("Two plus two is", " four")]
    model = BatchClientLM(
        provider="batch-api", base_url=serve.url, api_key=KEY, model="smollm2",
        tokenizer=str(bundled_model_path()), state_dir=str(tmp_path / "lm"),
        poll_interval_s=0.05,
    )  # fmt: skip
    with model:
        scores = model.loglikelihood(
            [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]
        )
        rolling = model.loglikelihood_rolling(
            [Instance("loglikelihood_rolling", {}, ("Paris",), 0)]
        )
    tok = tokenizer()
    for (context, continuation), (score, _) in zip(pairs, scores, strict=True):
        ctx, whole = tok([context]).input_ids[0], tok([context + continuation]).input_ids[0]
        assert score == pytest.approx(sum(token_logprob(t) for t in whole[len(ctx) :]))
    bodies = serve.stub.stats.bodies
    expected = [tok([c + x]).input_ids[0] for c, x in pairs]
    assert sorted(b["prompt"] for b in bodies[:2]) == sorted(expected)  # one call: either order
    assert all(b["echo"] is True and b["logprobs"] == 1 for b in bodies)
    assert bodies[2]["prompt"][0] == tok.bos_token_id and isinstance(rolling[0], float)


CHILD = textwrap.dedent(
    """
    import sys, anyio
    from batchclient import BatchAPIBatchInference

    async def main() -> None:
        url, key, state = sys.argv[1], sys.argv[2], sys.argv[3]
        options = {"api_key": key, "poll_interval_s": 0.05, "state_dir": state}
        async with BatchAPIBatchInference(url, **options) as c:
            msgs = [[{"role": "user", "content": f"k{i}"}] for i in range(40)]
            await c.batch_chat_completion("smollm2", msgs)
        print("finished", flush=True)

    anyio.run(main)
    """
)


def remote_ids(state: Path) -> int:
    import sqlite3

    db = state / "batchclient.sqlite3"
    if not db.exists():
        return 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        try:
            row = conn.execute("SELECT count(batch_id) FROM remote_parts").fetchone()
        except sqlite3.OperationalError:
            return 0
    return int(row[0])


def kill_once_submitted(serve: Serve, state: Path) -> None:
    """Run the call in a child and SIGKILL it once its remote batch id is stored."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, serve.url, KEY, str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_sync(lambda: remote_ids(state) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
async def test_killed_client_reattaches_without_a_second_submission(
    serve: Serve, tmp_path: Path
) -> None:
    release = threading.Event()  # the server's lines wait until the client has died
    serve.stub.faults.append(Fault(StubReply(hold=release), match="k"))
    kill_once_submitted(serve, tmp_path)
    running = await remote_batches(serve)
    assert [b["status"] for b in running] in (["validating"], ["in_progress"])  # died waiting
    release.set()
    async with client(serve, tmp_path) as c:
        result = await c.batch_chat_completion("smollm2", convo([f"k{i}" for i in range(40)]))
        batches = await remote_batches(serve)
    assert [i.completion_message.content for i in result.batch if i.completion_message] == [
        f"echo: k{i}" for i in range(40)
    ]
    assert len(batches) == 1  # re-attached: never submitted twice
    sent = serve.sent()
    assert len(sent) == 40 and max(sent.values()) == 1


async def test_cancel_cancels_on_the_server_and_keeps_what_finished(
    serve: Serve, tmp_path: Path
) -> None:
    serve.stub.latency_s = 0.05
    async with client(serve, tmp_path / "c") as c:
        record = await c.files.create(
            jsonl([line(f"r{i}", f"n{i}") for i in range(200)]), filename="in.jsonl"
        )
        job = await c.schedule_batch(record.id)

        async def some_done() -> bool:
            return (await c.batches.retrieve(job.job_id)).request_counts.completed >= 3

        await until(some_done, within=60)
        await c.job_cancel(job.job_id)
        info = await c.batches.retrieve(job.job_id)
        result = await c.job_result(job.job_id)
        batches = await remote_batches(serve)
    assert info.status == "cancelled"
    assert [b["status"] for b in batches] == ["cancelled"]
    done = [i for i in result.batch if i.error is None]
    assert 3 <= len(done) < 200
    assert all(i.error.code == "batch_cancelled" for i in result.batch if i.error)
