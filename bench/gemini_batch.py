"""``GeminiBatchInference`` through the ``google-genai`` SDK against the Gemini Batch API stub.

The stub (``batchclient.testing.GeminiBatchStub``) runs in this process with no simulated
processing time (``item_delay_s=0``), so a run's wall time is the client's own work plus the
stub answering echoes; the measured client is a fresh child process (its peak RSS sampled with
psutil every 10 ms).

Figures, for N conversations (default 10,000; 40-word prompts, ``max_tokens`` 16):

- ``inline`` and ``file``: one ``batch_chat_completion`` with the part sent inline in the
  create call (``inline_bytes`` at its cap, 95% of 20 MB) and uploaded as a JSONL file (the
  default for a part over 1 MiB): ``creates``, ``uploads``, ``bytes_uploaded`` (file uploads
  plus create bodies), ``total_s``, ``peak_rss_mib``, ``failed``;
- ``kill_reattach``: a child SIGKILLed while it waits on its batch (the stub holds each request
  1 ms so there is a wait), then the same call in a new child: ``creates`` over both (target 1),
  ``resume_s`` (the second child's call).

Usage: ``python bench/gemini_batch.py [-n 10000] [--out bench/results/gemini_batch.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from batchclient.batchapi._gemini import INLINE_CAP
from batchclient.testing import GeminiBatchStub

KEY = "bench-key"


def child(url: str, state: str, n: int, inline_bytes: int) -> None:
    """The measured client: one call of ``n`` conversations; prints JSON figures."""
    import threading

    import anyio
    import psutil

    from batchclient import GeminiBatchInference, SamplingParams

    peak = [0]

    def sample() -> None:
        proc = psutil.Process()
        while True:
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True).start()
    out: dict[str, Any] = {"baseline_rss_mib": psutil.Process().memory_info().rss / 2**20}
    options: dict[str, Any] = {} if inline_bytes < 0 else {"inline_bytes": inline_bytes}

    async def run() -> None:
        messages = [
            [{"role": "user", "content": f"Question {i}: " + " ".join(f"w{j}" for j in range(40))}]
            for i in range(n)
        ]
        async with GeminiBatchInference(
            url, api_key=KEY, poll_interval_s=0.25, state_dir=state, **options
        ) as c:
            started = time.perf_counter()
            result = await c.batch_chat_completion(
                "gemini-x", messages, sampling_params=SamplingParams(max_tokens=16)
            )
            out["total_s"] = time.perf_counter() - started
        out["peak_rss_mib"] = peak[0] / 2**20
        out["failed"] = len(result.errors)

    anyio.run(run)
    print(json.dumps(out), flush=True)


def spawn(url: str, state: str, n: int, inline_bytes: int = -1) -> subprocess.Popen[bytes]:
    args = [sys.executable, __file__, "--child", url, state, str(n), str(inline_bytes)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def measured(stub: GeminiBatchStub, n: int, inline_bytes: int) -> dict[str, Any]:
    before = (stub.stats.creates, stub.stats.uploads, stub.stats.upload_bytes)
    inline_before = stub.stats.inline_bytes
    with tempfile.TemporaryDirectory() as state:
        proc = spawn(stub.url, state, n, inline_bytes)
        stdout, stderr = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(stderr.decode()[-2000:])
    out: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    out["creates"] = stub.stats.creates - before[0]
    out["uploads"] = stub.stats.uploads - before[1]
    out["bytes_uploaded"] = (
        stub.stats.upload_bytes - before[2] + stub.stats.inline_bytes - inline_before
    )
    return out


def _submitted(state: str) -> bool:
    db = Path(state) / "batchclient.sqlite3"
    if not db.exists():
        return False
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        try:
            sql = "SELECT count(*) FROM remote_parts WHERE batch_id IS NOT NULL"
            return bool(conn.execute(sql).fetchone()[0])
        except sqlite3.OperationalError:
            return False


def kill_reattach(n: int) -> dict[str, Any]:
    with (
        GeminiBatchStub(api_key=KEY, item_delay_s=0.001) as stub,
        tempfile.TemporaryDirectory() as state,
    ):
        proc = spawn(stub.url, state, n)
        deadline = time.monotonic() + 300
        while not (_submitted(state) and stub.stats.polls >= 1) and time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(proc.stderr.read().decode()[-2000:] if proc.stderr else "")
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        killed_creates = stub.stats.creates
        again = spawn(stub.url, state, n)
        stdout, stderr = again.communicate(timeout=900)
        if again.returncode != 0:
            raise RuntimeError(stderr.decode()[-2000:])
        second = json.loads(stdout.decode().strip().splitlines()[-1])
        return {
            "creates_before_kill": killed_creates,
            "creates": stub.stats.creates,
            "requests_submitted": stub.stats.requests,
            "resume_s": second["total_s"],
            "failed": second["failed"],
        }


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        url, state, n, inline_bytes = sys.argv[2:6]
        child(url, state, int(n), int(inline_bytes))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=Path("bench/results/gemini_batch.json"))
    args = parser.parse_args()
    results: dict[str, Any] = {
        "n": args.n,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    with GeminiBatchStub(api_key=KEY) as stub:
        results["inline"] = measured(stub, args.n, INLINE_CAP)
        results["file"] = measured(stub, args.n, 0)
    results["kill_reattach"] = kill_reattach(args.n)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
