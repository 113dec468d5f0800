"""Requests sent again after a kill-and-resume of ``batchclient run`` (goal: <= the in-flight
window).

Runs a job of ``--n`` lines through ``batchclient run`` in a subprocess, SIGKILLs it once the server
has received a third of the requests, runs the same command again to the end, and counts with a
proxy in front of the server how many request bodies the server received more than once. Also
checks every custom_id is in the output exactly once. Against the stub (in its own process, with
latency) by default; ``--base-url`` targets a real server (e.g. the vLLM dev server) instead.

    python bench/jobs_resume.py [--n 300] [--window 16] [--repeats 3]
    python bench/jobs_resume.py --base-url URL --repeats 1 --tag real

Writes bench/results/jobs_resume[_TAG].json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from _jobs_common import child_env, save, stub_process, write_input
from batchclient.testing import CountingProxy


def committed(state: Path) -> int:
    db = state / "batchclient.sqlite3"
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
            row = conn.execute("SELECT coalesce(sum(completed + failed), 0) FROM jobs").fetchone()
    except sqlite3.OperationalError:
        return 0
    return int(row[0])


def one_run(upstream: str, n: int, window: int, max_tokens: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp, CountingProxy(upstream) as proxy:
        tmp_path = Path(tmp)
        inp = write_input(tmp_path / "in.jsonl", n, max_tokens=max_tokens)
        state, out = tmp_path / "state", tmp_path / "out.jsonl"
        cmd = [sys.executable, "-m", "batchclient.cli", "run", str(inp), "-o", str(out)]
        cmd += ["--base-url", proxy.url, "--state-dir", str(state)]
        cmd += ["--max-concurrency", str(window), "--no-progress"]
        proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        # killed once the server received a third of the requests: a moment unrelated to when
        # results are committed
        while proxy.requests < n // 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        at_kill, sent_before = committed(state), proxy.requests
        started = time.monotonic()
        subprocess.run(cmd, env=child_env(), check=True, stdout=subprocess.DEVNULL)
        resume_s = time.monotonic() - started
        ids = [json.loads(x)["custom_id"] for x in out.read_text().splitlines()]
        return {
            "committed_at_kill": at_kill,
            "sent_before_kill": sent_before,
            "lost_at_kill": sent_before - at_kill,
            "resent": proxy.resent,
            "distinct_requests": len(proxy.bodies),
            "every_custom_id_once": float(sorted(ids) == sorted(f"r{i}" for i in range(n))),
            "resume_run_s": resume_s,
        }


@contextlib.contextmanager
def target(base_url: str | None) -> Iterator[str]:
    if base_url:
        yield base_url
        return
    with stub_process(latency_s=0.02, jitter_s=0.08) as url:
        yield url


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--base-url", default=None, help="a real server (default: the stub)")
    p.add_argument("--tag", default="", help="suffix of the results file name")
    args = p.parse_args()
    with target(args.base_url) as url:
        runs = [one_run(url, args.n, args.window, args.max_tokens) for _ in range(args.repeats)]
    resent = [r["resent"] for r in runs]
    summary = {
        "target": "real server " + args.base_url if args.base_url else "stub (20-100 ms latency)",
        "n": args.n,
        "window": args.window,
        "median_resent": statistics.median(resent),
        "max_resent": max(resent),
        "goal_resent_at_most_window": max(resent) <= args.window,
        "runs": runs,
    }
    path = save("jobs_resume" + (f"_{args.tag}" if args.tag else ""), summary)
    print(
        f"requests re-sent after kill-and-resume: median {summary['median_resent']}, "
        f"max {summary['max_resent']} (window {args.window}; goal <= window: "
        f"{summary['goal_resent_at_most_window']}); every custom_id once: "
        f"{all(r['every_custom_id_once'] for r in runs)}\nwrote {path}"
    )


if __name__ == "__main__":
    main()
