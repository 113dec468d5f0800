"""Crash and resume on every batch API, one suite: a client in a child process is SIGKILLed at
the points that matter (a create sent whose answer it never saw; waiting on its remote batches;
collecting their results), and a new client on the same state directory finishes the work.
Against each backend's stub: the OpenAI-shaped Batch API (``BatchAPIStub``), Anthropic Message
Batches and Gemini batches (through their SDKs). After the restart every ``custom_id`` has
exactly one result, no part got a second remote batch, and no request was sent twice.

Also ``batchclient run --provider batch-api`` end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from batchclient import make_client
from batchclient.cli import main
from batchclient.remote import RetryPolicy
from batchclient.testing import AnthropicBatchStub, BatchAPIStub, GeminiBatchStub
from jobs_util import jsonl, line, read_jsonl, wait_sync

FAST = RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)
N = 9
LINES = 5  # parts of 5 and 4 requests: Anthropic's batches, unlabelled, are told apart by size
PARTS = 2
HELD = 60.0  # seconds a stub holds the answer the child is killed waiting for


@dataclass
class Backend:
    """One batch API as the suite drives it: its registry name, a stub factory (``delay``
    names the stub's create / collect hold), the client options, and how the stub counts."""

    name: str
    stub: Callable[..., Any]
    model: str
    options: dict[str, Any] = field(default_factory=dict)
    create_delay: str = "create_delay_s"
    collect_delay: str = "download_delay_s"

    def sent(self, stub: Any) -> int:
        """Requests in every remote batch the stub made."""
        return sum(len(_requests(b)) for b in stub.batches.values())

    def collecting(self, stub: Any) -> int:
        """Result downloads the stub has begun."""
        return int(stub.stats.results if self.name == "anthropic-batch" else stub.stats.downloads)


def _requests(batch: Any) -> list[Any]:
    for attr in ("lines", "requests", "items"):  # the OpenAI, Anthropic, Gemini stubs
        if hasattr(batch, attr):
            return list(getattr(batch, attr))
    raise AssertionError(f"no requests on {batch!r}")


BACKENDS = [
    Backend("batch-api", lambda **kw: BatchAPIStub(line_delay_s=0.05, **kw), "smollm2"),
    Backend(
        "anthropic-batch",
        lambda **kw: AnthropicBatchStub(process_s=1.0, **kw),
        "claude-x",
        {"api_key": "k"},
        collect_delay="results_delay_s",
    ),
    Backend(
        "gemini-batch",
        lambda **kw: GeminiBatchStub(item_delay_s=0.05, **kw),
        "gemini-x",
        {"api_key": "k", "inline_bytes": 0},  # uploaded: its results are a file download
    ),
]
# a child that imports an SDK takes seconds more: the quick tier keeps the OpenAI-shaped ones
SLOW = {"anthropic-batch", "gemini-batch"}

CHILD = textwrap.dedent(
    """
    import json, sys, anyio
    from batchclient import make_client

    name, url, state, mode, model, options, path = sys.argv[1:8]

    async def main() -> None:
        client = make_client(name, base_url=url, state_dir=state, **json.loads(options))
        async with client as c:
            if mode == "call":
                msgs = [[{"role": "user", "content": f"n{i}"}] for i in range(int(path))]
                await c.batch_chat_completion(model, msgs)
            else:
                record = await c.files.create(path)
                job = await c.schedule_batch(record.id)
                await c.batches.wait(job.job_id)
        print("finished", flush=True)

    anyio.run(main)
    """
)


def _cases() -> list[Any]:
    cases = []
    for backend in BACKENDS:
        marks = [pytest.mark.slow] if backend.name in SLOW else []
        for point, mode in (
            ("create", "job"),
            ("poll", "job"),
            ("collect", "job"),
            ("poll", "call"),
        ):
            cid = f"{backend.name}-{point}-{mode}"
            cases.append(pytest.param(backend, point, mode, marks=marks, id=cid))
    return cases


def _kill_at(backend: Backend, stub: Any, state: Path, point: str, mode: str, arg: str) -> None:
    """Run the child and SIGKILL it once it reached ``point``."""
    options = {**backend.options, "poll_interval_s": 0.05, "max_lines": LINES}
    argv = [backend.name, stub.url, str(state), mode, backend.model, json.dumps(options), arg]
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    reached: dict[str, Callable[[], bool]] = {
        "create": lambda: len(stub.batches) >= 1,  # made, its answer held back
        "poll": lambda: stub.stats.polls >= 1,
        "collect": lambda: backend.collecting(stub) >= 1,  # a download begun, held back
    }
    try:
        wait_sync(lambda: reached[point]() or proc.poll() is not None, timeout=90)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert b"finished" not in (proc.stdout.read() if proc.stdout else b"")


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "point", "mode"), _cases())
async def test_a_killed_client_resumes_without_sending_anything_twice(
    backend: Backend, point: str, mode: str, tmp_path: Path
) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([line(f"id {i}/é", f"n{i}", model=backend.model) for i in range(N)]))
    held = {point: HELD}
    delays = {"create": backend.create_delay, "collect": backend.collect_delay}
    state = tmp_path / "state"
    with backend.stub(**{delays[k]: v for k, v in held.items() if k in delays}) as stub:
        _kill_at(backend, stub, state, point, mode, str(N) if mode == "call" else str(inp))
        made = len(stub.batches)
        for name in delays.values():
            setattr(stub, name, 0.0)  # the stub answers at once from now on
        options = {**backend.options, "poll_interval_s": 0.02, "max_lines": LINES, "retry": FAST}
        async with make_client(
            backend.name, base_url=stub.url, state_dir=state, **options
        ) as client:
            if mode == "call":
                msgs = [[{"role": "user", "content": f"n{i}"}] for i in range(N)]
                result = await client.batch_chat_completion(backend.model, msgs)
                got = [i.completion_message.content for i in result.batch if i.completion_message]
                assert got == [f"echo: n{i}" for i in range(N)]
            else:
                (job,) = await client.batches.list()
                info = await client.batches.wait(job.id)  # resumed on entry
                out = tmp_path / "out.jsonl"
                await client.batches.export(job.id, out)
                assert info.status == "completed" and info.request_counts.completed == N
                rows = read_jsonl(out)
                assert sorted(r["custom_id"] for r in rows) == sorted(f"id {i}/é" for i in range(N))
                assert all(r["response"]["status_code"] == 200 for r in rows)
        assert made >= 1 and len(stub.batches) == PARTS  # one remote batch per part, ever
        assert backend.sent(stub) == N  # no request was sent twice


def test_cli_run_with_the_batch_api_provider(tmp_path: Path) -> None:
    inp, out, err = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    inp.write_bytes(jsonl([line(f"r{i}", f"n{i}" + (" BAD" if i == 3 else "")) for i in range(7)]))
    args = [
        "run", str(inp), "-o", str(out), "--errors", str(err), "--provider", "batch-api",
        "--poll-interval", "0.02", "--max-lines", "3", "--state-dir", str(tmp_path / "s"),
        "--no-progress",
    ]  # fmt: skip
    with BatchAPIStub(error_match="BAD") as stub:
        assert main([*args, "--base-url", stub.url]) == 0
        assert stub.stats.creates == 3
        assert main([*args, "--base-url", stub.url]) == 0  # done: rebuilds, sends nothing
        assert stub.stats.creates == 3
    assert [r["custom_id"] for r in read_jsonl(out)] == ["r0", "r1", "r2", "r4", "r5", "r6"]
    assert [r["response"]["status_code"] for r in read_jsonl(err)] == [400]


def test_cli_batch_api_needs_a_base_url(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([line("r0", "n0")]))
    code = main(["run", str(inp), "-o", str(tmp_path / "o"), "--provider", "batch-api"])
    assert code == 2
