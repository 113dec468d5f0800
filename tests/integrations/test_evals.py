"""lm-eval over batchclient equals lm-eval's own backends, item by item, on the local tasks
(``tests/evals``: 48 multiple-choice questions, 8 short generations, 6 perplexity texts), offline:

- over the inline provider against lm-eval's ``vllm`` backend, run by
  ``python -m batchclient.integrations.lm_eval`` (which also fixes that backend's version lookup
  on the CPU build of vLLM);
- over the remote provider against lm-eval's ``local-completions`` on the same real vLLM server;

both in float32, where scores do not depend on how the engine batched them;

and the scoring calls' per-item errors on both providers (an empty continuation, a context over
the model's length, an unknown model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from batchclient import (
    ErrorCode,
    ModelNotFoundError,
    RemoteBatchInference,
    VLLMBatchInference,
)
from batchclient._core.scoring import loglikelihood_requests
from batchclient.integrations.lm_eval import BatchClientLM
from batchclient.models import bundled_model_path
from batchclient.testing import CountingProxy
from lm_eval_tasks import MC_TASK, write_tasks
from lm_eval_util import OFFLINE, assert_same_run, evaluate, offline, read_output
from providers import MODEL

pytestmark = pytest.mark.timeout(1200)

LONG = "word " * 2100  # over the 2048-token context of the session's server and engine
BAD = [("The capital of France is", " Paris"), ("A context", ""), (LONG, " end")]


def check_bad_input(got: Any) -> None:
    assert got.batch[0].ok and got.batch[0].logprob < 0
    assert got.batch[1].error.code == ErrorCode.invalid_request  # empty continuation
    assert got.batch[2].error.code == ErrorCode.context_length_exceeded


# ------------------------------------------------------------------------------ remote


@pytest.mark.server
def test_remote_lm_equals_local_completions_and_a_rerun_sends_nothing(
    float32_url: str, tmp_path: Path
) -> None:
    """On the session's float32 server (conftest): in bfloat16 a score's last digits move with
    how the server happened to batch it (docs/evals.md), so two clients could not be compared
    to 1e-4."""
    offline()
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    vllm_url = float32_url

    tokenizer = str(bundled_model_path())
    theirs = LocalCompletionsAPI(
        base_url=f"{vllm_url}/completions",
        model=MODEL,
        tokenizer=tokenizer,
        tokenizer_backend="huggingface",
        num_concurrent=16,
        max_retries=1,
    )
    reference = evaluate(theirs, tmp_path / "tasks")
    with CountingProxy(vllm_url) as proxy:
        args: dict[str, Any] = {"provider": "remote", "base_url": proxy.url, "model": MODEL,
                "tokenizer": tokenizer, "state_dir": str(tmp_path / "state")}  # fmt: skip
        with BatchClientLM(**args) as lm:
            ours = evaluate(lm, tmp_path / "tasks")
        sent = proxy.requests
        with BatchClientLM(**args) as lm:
            again = evaluate(lm, tmp_path / "tasks")
        assert proxy.requests == sent > 0  # the second run found every answer stored
    assert_same_run(ours, reference)
    assert_same_run(again, ours, tol=0.0)


@pytest.mark.server
async def test_remote_scoring_over_the_servers_tokenize_route(
    vllm_url: str, tmp_path: Path
) -> None:
    pairs = [("Question: What is the capital of France?\nAnswer:", " Paris"), ("", "Hello there")]
    texts = ["The quick brown fox jumps over the lazy dog."]
    async with RemoteBatchInference(vllm_url, state_dir=tmp_path) as server_side:
        a = await server_side.batch_loglikelihood(MODEL, pairs)
        ra = await server_side.batch_loglikelihood_rolling(MODEL, texts)
    async with RemoteBatchInference(
        vllm_url, state_dir=tmp_path, tokenizer=bundled_model_path()
    ) as local:
        b = await local.batch_loglikelihood(MODEL, pairs)
        rb = await local.batch_loglikelihood_rolling(MODEL, texts)
    assert not a.errors and not ra.errors
    assert [(x.logprob, x.is_greedy, x.num_tokens) for x in a.batch] == [
        (x.logprob, x.is_greedy, x.num_tokens) for x in b.batch
    ]
    assert ra.batch[0].logprob == rb.batch[0].logprob


@pytest.mark.server
async def test_remote_bad_input_is_per_item(vllm_url: str, tmp_path: Path) -> None:
    async with RemoteBatchInference(
        vllm_url, state_dir=tmp_path, tokenizer=bundled_model_path()
    ) as client:
        check_bad_input(await client.batch_loglikelihood(MODEL, BAD))
        with pytest.raises(ModelNotFoundError):
            await client.batch_loglikelihood("no-such-model", BAD[:1])
    async with RemoteBatchInference(
        vllm_url, state_dir=tmp_path, check_model=False, tokenizer=bundled_model_path()
    ) as unchecked:
        got = await unchecked.batch_loglikelihood("no-such-model", BAD[:1])
        # the server's own verdict on an over-long prompt (no client-side check here: the
        # token ids are given, and the context length of an unknown model is unknown)
        too_long = await unchecked.batch_loglikelihood(MODEL, [([1] * 2100, [2])])
    unknown, refused = got.batch[0].error, too_long.batch[0].error
    assert unknown is not None and unknown.code == ErrorCode.model_not_found
    assert refused is not None and refused.code == ErrorCode.context_length_exceeded
    assert refused.status_code == 400


# ------------------------------------------------------------------------------ inline


def lm_eval_vllm(tasks: Path, out: Path) -> None:
    """lm-eval's own ``vllm`` backend on the bundled model, in a child process, through
    ``python -m batchclient.integrations.lm_eval`` (the version-lookup fix)."""
    env = {**os.environ, **OFFLINE, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env["PYTHONPATH"] = str(Path(__file__).parents[2] / "src")
    args = f"pretrained={bundled_model_path()},max_model_len=2048,enforce_eager=True,dtype=float32"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "batchclient.integrations.lm_eval",
            "run",
            "--model",
            "vllm",
            "--model_args",
            args,
            "--batch_size",
            "auto",
            "--tasks",
            "batchclient_mc,batchclient_gen,batchclient_ppl",
            "--include_path",
            str(tasks),
            "--log_samples",
            "--output_path",
            str(out),
        ],
        check=True,
        env=env,
        timeout=900,
        stdout=subprocess.DEVNULL,
    )


@pytest.mark.heavy
@pytest.mark.engine
async def test_inline_lm_equals_lm_evals_vllm_backend(
    float32_client: VLLMBatchInference, tmp_path: Path
) -> None:
    """Both engines in float32 (see ``float32_client``): lm-eval's own in a child process,
    then ours."""
    tasks = write_tasks(tmp_path / "tasks")
    await anyio.to_thread.run_sync(lm_eval_vllm, tasks, tmp_path / "vllm")
    reference = read_output(tmp_path / "vllm")
    lm = BatchClientLM.for_client(float32_client, MODEL, state_dir=tmp_path / "state")
    ours = await anyio.to_thread.run_sync(evaluate, lm, tmp_path / "tasks")
    assert_same_run(ours, reference)
    assert reference[0][MC_TASK]["acc,none"] == ours[0][MC_TASK]["acc,none"]


@pytest.mark.engine
async def test_inline_bad_input_is_per_item(inline_client: VLLMBatchInference) -> None:
    check_bad_input(await inline_client.batch_loglikelihood(MODEL, BAD))
    with pytest.raises(ModelNotFoundError):
        await inline_client.batch_loglikelihood("no-such-model", BAD[:1])
    # a request for an unknown model that reaches the engine anyway (a batch line) is that
    # item's error
    [request] = loglikelihood_requests("no-such-model", [([1, 2], [3])], None, None)
    result = await inline_client.provider.execute(request)
    assert result.error is not None and result.error.code == ErrorCode.model_not_found


@pytest.mark.server
def test_the_lm_eval_command_runs_an_offline_task_on_the_server(
    vllm_url: str, tmp_path: Path
) -> None:
    tasks = write_tasks(tmp_path / "tasks")
    env = {**os.environ, **OFFLINE, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    command = [
        sys.executable, "-m", "batchclient.cli", "lm-eval", "--provider", "remote",
        "--base-url", vllm_url, "--model", MODEL, "--tokenizer", str(bundled_model_path()),
        "--state-dir", str(tmp_path / "state"), "--",
        "--tasks", MC_TASK, "--include_path", str(tasks), "--limit", "8",
        "--output_path", str(tmp_path / "out"), "--log_samples",
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics, samples = read_output(tmp_path / "out")
    assert 0.0 <= metrics[MC_TASK]["acc,none"] <= 1.0 and len(samples[MC_TASK]) == 8
    assert (tmp_path / "state" / "batchclient.sqlite3").stat().st_mode & 0o077 == 0  # private
