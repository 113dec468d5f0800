"""``AnthropicBatchInference`` through the Message Batches stub: what 10,000 conversations cost
the client, and a kill-and-re-attach run.

Two processes: the stub (``AnthropicBatchStub``, in a child of this script, so its memory is not
counted) and the measured client (this process). Figures, for N conversations (default 10,000;
40-word prompts, ``max_tokens`` 16):

- ``creates`` / ``create_calls``: remote batches made / ``POST /v1/messages/batches`` sent;
  ``bytes_uploaded``: the create bodies' bytes, as the stub read them;
- ``wall_s``: the whole ``batch_chat_completion`` (translate, pack, create, poll, read the
  results, decode) with the stub's simulated processing at 0 s, so it is the client's own time
  plus at most one ``poll_interval_s`` per batch; ``peak_rss_mib`` (psutil, every 10 ms) and
  ``rss_before_mib`` (after imports, before the call);
- ``kill``: a child client SIGKILLed once it polls its batch (the stub holds each batch 3 s),
  then the same call made again from a fresh process: ``creates`` (target 1), every answer
  back.

Usage: ``python bench/anthropic_batch.py [-n 10000] [--poll-interval 0.05]
[--out bench/results/anthropic_batch.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

KEY = "sk-ant-bench"


def prompt(i: int) -> str:
    return f"Question {i}: " + " ".join(f"word{j}" for j in range(40))


def serve(process_s: float) -> None:
    """The stub in this process: prints its URL, then its stats as JSON for each line read."""
    from batchclient.testing import AnthropicBatchStub

    with AnthropicBatchStub(process_s=process_s) as stub:
        print(stub.url, flush=True)
        for _ in sys.stdin:
            s = stub.stats
            figures = {"creates": s.creates, "create_calls": s.create_calls,
                       "bytes_uploaded": s.bytes_in, "requests": s.requests, "polls": s.polls,
                       "results": s.results}  # fmt: skip
            print(json.dumps(figures), flush=True)


class Stub:
    def __init__(self, process_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(process_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()

    def stats(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return dict(json.loads(self.proc.stdout.readline()))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


CALL = """
import sys, anyio
from batchclient import AnthropicBatchInference, SamplingParams
url, state, n, poll = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
def prompt(i):
    return f"Question {i}: " + " ".join(f"word{j}" for j in range(40))
async def main():
    opts = dict(api_key="KEY", poll_interval_s=poll, state_dir=state)
    async with AnthropicBatchInference(url, **opts) as c:
        msgs = [[{"role": "user", "content": prompt(i)}] for i in range(n)]
        sampling = SamplingParams(max_tokens=16)
        r = await c.batch_chat_completion("claude-x", msgs, sampling_params=sampling)
    print(sum(i.error is None for i in r.batch), flush=True)
anyio.run(main)
""".replace("KEY", KEY)


def measured(url: str, n: int, poll: float) -> dict[str, Any]:
    import anyio
    import psutil

    from batchclient import AnthropicBatchInference, SamplingParams

    proc = psutil.Process()
    before = proc.memory_info().rss
    peak = [before]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.01)

    async def run() -> tuple[int, float]:
        with tempfile.TemporaryDirectory() as state:
            async with AnthropicBatchInference(
                url, api_key=KEY, poll_interval_s=poll, state_dir=state
            ) as c:
                msgs = [[{"role": "user", "content": prompt(i)}] for i in range(n)]
                started = time.perf_counter()
                r = await c.batch_chat_completion(
                    "claude-x", msgs, sampling_params=SamplingParams(max_tokens=16)
                )
                wall = time.perf_counter() - started
        return sum(i.error is None for i in r.batch), wall

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    ok, wall = anyio.run(run)
    stop.set()
    sampler.join()
    mib = 1024 * 1024
    return {"answered": ok, "wall_s": round(wall, 3), "rss_before_mib": round(before / mib, 1),
            "peak_rss_mib": round(peak[0] / mib, 1)}  # fmt: skip


def kill_and_reattach(n: int, poll: float) -> dict[str, Any]:
    stub = Stub(process_s=3.0)
    try:
        with tempfile.TemporaryDirectory() as state:
            args = [sys.executable, "-c", CALL, stub.url, state, str(n), str(poll)]
            child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 120
            while stub.stats()["polls"] < 1 and child.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("the child never polled")
                time.sleep(0.05)
            child.send_signal(signal.SIGKILL)
            child.wait(10)
            at_kill = stub.stats()["creates"]
            again = subprocess.run(args, capture_output=True, text=True, timeout=300)
            if again.returncode != 0:
                raise RuntimeError(again.stderr[-2000:])
            answered = int(again.stdout.strip())
            figures = stub.stats()
    finally:
        stub.close()
    return {"creates_at_kill": at_kill, "creates": figures["creates"], "answered": answered,
            "requests_sent": figures["requests"]}  # fmt: skip


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(float(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=10_000)
    parser.add_argument("--poll-interval", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    stub = Stub(process_s=0.0)
    try:
        call = measured(stub.url, args.n, args.poll_interval)
        call.update(stub.stats())
    finally:
        stub.close()
    report = {
        "n": args.n,
        "poll_interval_s": args.poll_interval,
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
        "call": call,
        "kill": kill_and_reattach(args.n, args.poll_interval),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
