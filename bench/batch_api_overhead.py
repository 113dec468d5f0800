"""Submission overhead of ``BatchAPIBatchInference`` against ``batchclient serve`` over the stub.

Three processes besides this one: the chat stub (``python -m batchclient.testing stub``),
``batchclient serve --provider remote`` pointed at the stub (256 in flight), and the measured
client, a fresh child per run.

Figures, for N conversations (default 10,000; 40-word prompts, ``max_tokens`` 16):

- ``call_batch_api``: one ``BatchAPIBatchInference.batch_chat_completion`` at the server.
  ``write_upload_s``: from the call until every remote batch has its id (the requests written as
  batch JSONL into the state directory, split, uploaded, ``POST /batches``), with
  ``write_upload_peak_rss_mib``, the client's peak RSS until then (psutil, every 10 ms);
  ``total_s``: the whole call (write, upload, the server running the batch, polls, download,
  decode) and ``total_peak_rss_mib``;
- ``call_direct``: the same call through ``RemoteBatchInference`` straight at the stub (256 in
  flight); ``call_total_over_direct`` = the two ``total_s`` divided;
- ``run_batch_api_s`` / ``run_direct_s``: the same file through ``batchclient run --provider
  batch-api`` at the server / ``--provider remote`` at the stub (whole processes, start-up
  included), and their ratio.

Usage: ``python bench/batch_api_overhead.py [-n 10000] [--max-lines 50000] [--poll-interval
0.25] [--out bench/results/batch_api_overhead.json]``.
"""

from __future__ import annotations

import argparse
import contextlib
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


def child(mode: str, url: str, state: str, n: int, max_lines: int, poll: float) -> None:
    """The measured client: one ``batch_chat_completion`` of ``n`` conversations, through the
    Batch API at ``url`` (``mode`` ``batch-api``) or straight at the stub (``direct``, the
    remote fan-out with 256 in flight); prints JSON figures."""
    import anyio
    import psutil

    from batchclient import BatchAPIBatchInference, BatchClient, RemoteBatchInference

    peak = [0]

    def sample() -> None:
        proc = psutil.Process()
        while True:
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.01)

    threading.Thread(target=sample, daemon=True).start()
    out: dict[str, Any] = {"baseline_rss_mib": psutil.Process().memory_info().rss / 2**20}
    client: BatchClient
    if mode == "batch-api":
        client = BatchAPIBatchInference(
            url, poll_interval_s=poll, max_lines=max_lines, state_dir=state
        )
    else:
        client = RemoteBatchInference(url, max_concurrency=256, state_dir=state)

    async def run() -> None:
        from batchclient import SamplingParams

        messages = [[{"role": "user", "content": prompt(i)}] for i in range(n)]
        async with client as c:
            started = time.perf_counter()
            async with anyio.create_task_group() as tg:
                if mode == "batch-api":
                    tg.start_soon(watch_submission, c.state_dir, -(-n // max_lines), started, out)
                result = await c.batch_chat_completion(
                    "smollm2", messages, sampling_params=SamplingParams(max_tokens=16)
                )
                tg.cancel_scope.cancel()
            out["total_s"] = time.perf_counter() - started
            out["total_peak_rss_mib"] = peak[0] / 2**20
            out["failed"] = len(result.errors)
            if "write_upload_s" in out:
                out["write_upload_peak_rss_mib"] = out.pop("_peak")

    async def watch_submission(
        state_dir: Path, parts: int, started: float, into: dict[str, Any]
    ) -> None:
        """Record when every remote batch of the call has its id in the state directory."""
        import sqlite3

        import anyio

        path = state_dir / "batchclient.sqlite3"
        while True:
            created = 0
            if path.exists():
                with (
                    sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db,
                    contextlib.suppress(sqlite3.OperationalError),  # table not made yet
                ):
                    sql = "SELECT count(*) FROM remote_parts WHERE batch_id IS NOT NULL"
                    (created,) = db.execute(sql).fetchone()
            if created >= parts:
                into["write_upload_s"] = time.perf_counter() - started
                into["_peak"] = peak[0] / 2**20
                return
            await anyio.sleep(0.005)

    anyio.run(run)
    print(json.dumps(out))


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
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def measure(args: argparse.Namespace, mode: str, url: str, state: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", mode, url, str(state), "-n", str(args.n)]
    cmd += ["--max-lines", str(args.max_lines), "--poll-interval", str(args.poll_interval)]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the measured client failed:\n{done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=10_000, help="conversations (default 10000)")
    p.add_argument("--max-lines", type=int, default=50_000, help="split limit (default 50000)")
    p.add_argument("--poll-interval", type=float, default=0.25, help="seconds (default 0.25)")
    p.add_argument("--out", type=Path, default=Path("bench/results/batch_api_overhead.json"))
    p.add_argument("--child", nargs=3, metavar=("MODE", "URL", "STATE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        mode, url, state = args.child
        child(mode, url, state, args.n, args.max_lines, args.poll_interval)
        return
    py = sys.executable
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, StubProcess() as stub:
        tmpdir = Path(tmp)
        port = free_port()
        serve_url = f"http://127.0.0.1:{port}/v1"
        server = subprocess.Popen(
            [py, "-m", "batchclient.cli", "serve", "--provider", "remote", "--base-url", stub.url,
             "--max-concurrency", "256", "--port", str(port), "--log-level", "warning",
             "--state-dir", str(tmpdir / "server")]
        )  # fmt: skip
        try:
            wait_ready(serve_url)
            figures["call_batch_api"] = measure(args, "batch-api", serve_url, tmpdir / "c1")
            figures["call_direct"] = measure(args, "direct", stub.url, tmpdir / "c2")
            inp = tmpdir / "in.jsonl"
            write_input(inp, args.n)
            cli = [py, "-m", "batchclient.cli", "run", str(inp), "--no-progress"]
            figures["run_batch_api_s"] = timed(
                [*cli, "-o", str(tmpdir / "o1.jsonl"), "--provider", "batch-api",
                 "--base-url", serve_url, "--poll-interval", str(args.poll_interval),
                 "--max-lines", str(args.max_lines), "--state-dir", str(tmpdir / "r1")]
            )  # fmt: skip
            figures["run_direct_s"] = timed(
                [*cli, "-o", str(tmpdir / "o2.jsonl"), "--provider", "remote",
                 "--base-url", stub.url, "--max-concurrency", "256",
                 "--state-dir", str(tmpdir / "r2")]
            )  # fmt: skip
        finally:
            server.terminate()
            server.wait(30)
    call, direct = figures["call_batch_api"], figures["call_direct"]
    figures["call_total_over_direct"] = call["total_s"] / direct["total_s"]
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
