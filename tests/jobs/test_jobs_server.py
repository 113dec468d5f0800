"""Jobs against the real vLLM OpenAI server with the bundled model: a prompt over the context
fails only its line, request counts, the server's own refusal shape in the error file, and the
SIGKILL crash test of ``batchclient run`` with a counting proxy in front of the server (a re-run
sends only what did not finish)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from batchclient import RemoteBatchInference
from batchclient.cli import main
from batchclient.testing import CountingProxy
from jobs_util import done_in_db, jsonl, line, read_jsonl, wait_sync

pytestmark = pytest.mark.server


async def run_job(url: str, state: Path, lines: list[str]) -> tuple[Any, Any, dict[str, Any]]:
    async with RemoteBatchInference(url, state_dir=state, max_concurrency=8) as c:
        record = await c.files.create(jsonl(lines))
        job_id = (await c.schedule_batch(record.id)).job_id
        with anyio.fail_after(300):
            job = await c.batches.wait(job_id)
        result = await c.job_result(job_id)
        files = {}
        for kind, file_id in (("output", job.output_file_id), ("error", job.error_file_id)):
            raw = (await c.files.content(file_id)).decode() if file_id else ""
            files[kind] = [json.loads(x) for x in raw.splitlines()]
    return job, result, files


async def test_prompt_longer_than_the_context_fails_only_its_line(
    vllm_url: str, tmp_path: Path
) -> None:
    huge = " ".join(["word"] * 200_000)
    job, result, files = await run_job(
        vllm_url, tmp_path, [line("a", "Say hi"), line("b", huge), line("c", "Say bye")]
    )
    assert job.request_counts.model_dump() == {"total": 3, "completed": 2, "failed": 1}
    assert [o["custom_id"] for o in files["output"]] == ["a", "c"]
    (err,) = files["error"]
    assert err["custom_id"] == "b" and err["response"]["status_code"] == 400
    assert [r.error is None for r in result.batch] == [True, False, True]
    assert result.batch[1].error.code == "context_length_exceeded"


async def test_counts_and_the_servers_refusal_shape(vllm_url: str, tmp_path: Path) -> None:
    from openai.types.chat import ChatCompletion

    job, result, files = await run_job(
        vllm_url,
        tmp_path,
        [
            line("good", "Name a colour."),
            line("neg1", "x", max_tokens=-5),
            line("neg2", "y", max_tokens=-5),
            line("huge", "z", max_tokens=10_000_000),
        ],
    )
    assert job.request_counts.model_dump() == {"total": 4, "completed": 1, "failed": 3}
    assert job.usage.output_tokens >= 1 and job.usage.input_tokens > 0
    (good,) = files["output"]
    body = ChatCompletion.model_validate(good["response"]["body"])
    assert body.choices[0].message.content
    errors = {e["custom_id"]: e for e in files["error"]}
    for cid in ("neg1", "neg2", "huge"):
        assert errors[cid]["error"] is None and errors[cid]["response"]["status_code"] == 400
        assert set(errors[cid]["response"]["body"]["error"]) >= {"message", "type", "param", "code"}
        assert errors[cid]["response"]["body"]["error"]["param"] == "max_tokens"
    assert [r.custom_id for r in result.batch] == ["good", "neg1", "neg2", "huge"]
    assert all(r.error is not None and r.error.status_code == 400 for r in result.batch[1:])


@pytest.mark.heavy
def test_crash_and_resume_against_the_real_server(vllm_url: str, tmp_path: Path) -> None:
    """300 lines through ``batchclient run`` in a subprocess, SIGKILLed after ~100 results, run
    again: every custom_id once, completed + failed == 300, and what the server received
    twice is at most the in-flight window (counted by a proxy in front of the server)."""
    window = 16
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([line(f"r{i}", f"Count to {i}.", max_tokens=4) for i in range(300)]))
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    with CountingProxy(vllm_url) as proxy:
        args = [
            "run",
            str(inp),
            "-o",
            str(out),
            "--base-url",
            proxy.url,
            "--state-dir",
            str(state),
            "--max-concurrency",
            str(window),
            "--no-progress",
        ]
        proc = subprocess.Popen(
            [sys.executable, "-m", "batchclient.cli", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # killed at a moment set by what the server received, unrelated to commits
        wait_sync(
            lambda: proxy.requests >= 100 + window or proc.poll() is not None,
            timeout=240,
            every=0.002,
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        at_kill = done_in_db(state)
        sent_before = proxy.requests
        assert main(args) == 0
        counts: Counter[bytes] = proxy.bodies
    assert 100 <= at_kill < 300
    assert sent_before - at_kill <= window
    rows = read_jsonl(out)
    assert sorted(int(r["custom_id"][1:]) for r in rows) == list(range(300))
    assert sum(r["error"] is None and r["response"]["status_code"] == 200 for r in rows) == 300
    assert len(counts) == 300 and proxy.resent <= window
