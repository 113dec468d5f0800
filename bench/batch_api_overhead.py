"""Submission overhead of ``BatchAPIBatchInference`` against ``batchclient serve`` over the stub.

Three processes besides this one: the chat stub (``python -m batchclient.testing stub``),
``batchclient serve`` over a ``RemoteProvider`` pointed at the stub (uvicorn, via
``batchclient.server.create_app``), and the measured client, a fresh child per run.

Figures, for one ``batch_chat_completion`` of N conversations (default 10,000):

- ``write_upload_s``: from the call until every remote batch is created (the requests written as
  batch JSONL into the state directory, split, uploaded, ``POST /batches``), and
  ``write_upload_peak_rss_mib``: the client's peak RSS until then (psutil, sampled every 10 ms);
- ``total_s``: the whole call (write, upload, the server running the batch, polls, download,
  decode), ``total_peak_rss_mib``;
- ``run_batch_api_s``: the same file through ``batchclient run --provider batch-api`` at the
  server; ``run_direct_s``: the same file through ``batchclient run --provider remote`` straight
  at the stub; the ratios of both Batch API figures to ``run_direct_s``.

Usage: ``python bench/batch_api_overhead.py [-n 10000] [--max-lines 50000] [--poll-interval
0.25] [--out bench/results/batch_api_overhead.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from batchclient.testing import StubProcess, free_port


def prompt(i: int) -> str:
    return f"Question {i}: " + " ".join(f"word{j}" for j in range(40))


def child(url: str, state: str, n: int, max_lines: int, poll: float) -> None:
    """The measured client: one ``batch_chat_completion`` of ``n`` conversations; prints JSON."""
    import sqlite3

    import anyio
    import psutil

    from batchclient import BatchAPIBatchInference, SamplingParams

    peak = [0]

    def sample() -> None:
        proc = psutil.Process()
        while True:
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True).start()
    out: dict[str, Any] = {}

    async def run() -> None:
        messages = [[{"role": "user", "content": prompt(i)}] for i in range(n)]
        parts = -(-n // max_lines)
        async with BatchAPIBatchInference(
            url, poll_interval=poll, max_lines=max_lines, state_dir=state
        ) as c:
            db = sqlite3.connect(c.state_dir / "batchclient.sqlite3", check_same_thread=False)
            started = time.perf_counter()

            async def watch() -> None:
                while True:
                    (created,) = db.execute(
                        "SELECT count(*) FROM remote_parts WHERE batch_id IS NOT NULL"
                    ).fetchone()
                    if created >= parts:
                        out["write_upload_s"] = time.perf_counter() - started
                        out["write_upload_peak_rss_mib"] = peak[0] / 2**20
                        return
                    await anyio.sleep(0.005)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                result = await c.batch_chat_completion(
                    "smollm2", messages, sampling_params=SamplingParams(max_tokens=16)
                )
            out["total_s"] = time.perf_counter() - started
            out["total_peak_rss_mib"] = peak[0] / 2**20
            out["failed"] = len(result.errors)
            db.close()

    anyio.run(run)
    print(json.dumps(out))


SERVER = r"""
import sys, uvicorn
from batchclient import RemoteProvider
from batchclient.server import create_app
stub, state, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
app = create_app(RemoteProvider(stub, max_concurrency=256), state_dir=state)
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
"""


def wait_ready(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/models", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def write_input(path: Path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            body = {
                "model": "smollm2",
                "messages": [
                    {
                        "role": "user",
                        "content": f"Question {i}: " + " ".join(f"word{j}" for j in range(40)),
                    }
                ],
                "max_tokens": 16,
            }
            f.write(
                json.dumps(
                    {
                        "custom_id": str(i),
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": body,
                    }
                )
                + "\n"
            )


def timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=10_000, help="conversations (default 10000)")
    p.add_argument("--max-lines", type=int, default=50_000, help="split limit (default 50000)")
    p.add_argument("--poll-interval", type=float, default=0.25, help="seconds (default 0.25)")
    p.add_argument("--out", type=Path, default=Path("bench/results/batch_api_overhead.json"))
    p.add_argument("--child", nargs=2, metavar=("URL", "STATE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.n, args.max_lines, args.poll_interval)
        return
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp, StubProcess() as stub:
        tmpdir = Path(tmp)
        port = free_port()
        serve_url = f"http://127.0.0.1:{port}/v1"
        server = subprocess.Popen([py, "-c", SERVER, stub.url, str(tmpdir / "server"), str(port)])
        try:
            wait_ready(serve_url)
            measured = subprocess.run(
                [py, __file__, "--child", serve_url, str(tmpdir / "client"), "-n", str(args.n),
                 "--max-lines", str(args.max_lines), "--poll-interval", str(args.poll_interval)],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            figures: dict[str, Any] = json.loads(measured.stdout.strip().splitlines()[-1])
            inp = tmpdir / "in.jsonl"
            write_input(inp, args.n)
            cli = [py, "-m", "batchclient.cli", "run", str(inp), "--no-progress"]
            figures["run_batch_api_s"] = timed(
                [*cli, "-o", str(tmpdir / "o1.jsonl"), "--provider", "batch-api",
                 "--base-url", serve_url, "--poll-interval", str(args.poll_interval),
                 "--max-lines", str(args.max_lines), "--state-dir", str(tmpdir / "cli1")]
            )  # fmt: skip
            figures["run_direct_s"] = timed(
                [*cli, "-o", str(tmpdir / "o2.jsonl"), "--provider", "remote",
                 "--base-url", stub.url, "--max-concurrency", "256",
                 "--state-dir", str(tmpdir / "cli2")]
            )  # fmt: skip
        finally:
            server.terminate()
            server.wait(30)
    figures["total_over_run_direct"] = figures["total_s"] / figures["run_direct_s"]
    figures["run_batch_api_over_run_direct"] = figures["run_batch_api_s"] / figures["run_direct_s"]
    report = {
        "n": args.n,
        "max_lines": args.max_lines,
        "poll_interval_s": args.poll_interval,
        "figures": figures,
        "environment": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "note": "shared, busy development machine: orientation, not a final figure",
            "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
