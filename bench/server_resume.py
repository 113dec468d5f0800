"""SIGKILL of ``batchclient serve`` at about one third of a 300-line batch against the real vLLM
server, then a restart on the same state directory: how many requests were sent twice (goal: at
most the in-flight window) and whether every custom_id appears once.

The real vLLM OpenAI server (bundled model) runs behind a counting proxy
(``batchclient.testing.CountingProxy``), which counts every request it forwards by its body.
``batchclient serve --max-concurrency 16`` runs as a child process; the batch is uploaded and
created with the openai SDK; the server is SIGKILLed once 100 results are committed (read from
its SQLite file), started again, and the batch is polled to the end (the counts are checked
never to go back). It starts a vLLM server: run it alone on the machine.

    python bench/server_resume.py [--n 300] [--window 16] [--max-tokens 16]

Writes bench/results/server_resume.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from _jobs_common import save, write_input
from _server_common import start_serve
from batchclient.testing import CountingProxy, vllm_server


def committed(state: Path) -> int:
    db = state / "batchclient.sqlite3"
    if not db.exists():
        return 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        try:
            row = conn.execute("SELECT coalesce(sum(completed + failed), 0) FROM jobs").fetchone()
        except sqlite3.OperationalError:
            return 0
    return int(row[0])


def measure(n: int, window: int, max_tokens: int) -> dict[str, Any]:
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    with tempfile.TemporaryDirectory() as name, vllm_server(env=env) as vllm:
        tmp = Path(name)
        inp = write_input(tmp / "in.jsonl", n, max_tokens=max_tokens)
        state = tmp / "state"
        extra = ("--max-concurrency", str(window))
        with CountingProxy(vllm) as proxy:
            url, proc = start_serve(proxy.url, state, *extra)
            port = url.rsplit(":", 1)[1]
            try:
                client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
                with inp.open("rb") as f:
                    upload = client.files.create(file=f, purpose="batch")
                batch = client.batches.create(
                    input_file_id=upload.id, endpoint="/v1/chat/completions",
                    completion_window="24h",
                )  # fmt: skip
                seen = []
                while committed(state) < n // 3:
                    time.sleep(0.005)
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                at_kill, sent_before = committed(state), proxy.requests
                started = time.perf_counter()
                url, proc = start_serve(proxy.url, state, *extra, port=int(port))
                restart_s = time.perf_counter() - started
                while (b := client.batches.retrieve(batch.id)).status != "completed":
                    assert b.status in ("in_progress", "finalizing"), b.status
                    assert b.request_counts is not None
                    seen.append(b.request_counts.completed + b.request_counts.failed)
                    time.sleep(0.1)
                assert b.output_file_id is not None and b.request_counts is not None
                ids = [json.loads(x)["custom_id"] for x in
                       client.files.content(b.output_file_id).text.splitlines()]  # fmt: skip
                errors = b.request_counts.failed
            finally:
                proc.kill()
                proc.wait()
            resent, distinct = proxy.resent, len(proxy.bodies)
    return {
        "n": n,
        "window": window,
        "max_tokens": max_tokens,
        "committed_at_kill": at_kill,
        "sent_before_kill": sent_before,
        "in_flight_lost_at_kill": sent_before - at_kill,
        "restart_s": restart_s,
        "resent_after_restart": resent,
        "distinct_requests_sent": distinct,
        "output_lines": len(ids),
        "failed_lines": errors,
        "every_custom_id_once": sorted(ids) == sorted(f"r{i}" for i in range(n)),
        "counts_never_went_back": seen == sorted(seen) and all(x >= at_kill for x in seen),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=300, help="request lines (default 300)")
    p.add_argument("--window", type=int, default=16, help="requests in flight (default 16)")
    p.add_argument("--max-tokens", type=int, default=16, help="per request (default 16)")
    args = p.parse_args()
    figures = measure(args.n, args.window, args.max_tokens)
    figures["goal_resent_at_most_window"] = figures["resent_after_restart"] <= args.window
    path = save("server_resume", figures)
    print(
        f"{args.n} lines, window {args.window}: SIGKILL with {figures['committed_at_kill']} "
        f"committed, {figures['sent_before_kill']} sent; restarted in "
        f"{figures['restart_s']:.1f} s; re-sent {figures['resent_after_restart']} (goal <= "
        f"{args.window}: {figures['goal_resent_at_most_window']}); every custom_id once: "
        f"{figures['every_custom_id_once']}; counts never went back: "
        f"{figures['counts_never_went_back']}\nwrote {path}"
    )


if __name__ == "__main__":
    main()
