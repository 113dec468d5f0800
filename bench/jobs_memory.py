"""Peak RSS of ``batchclient run`` on a 100,000-line job vs a 1,000-line job (goal: <= 150 MB
apart): memory must not grow with the input (vllm #30268: a 500k-line job held it all in
memory).

Each job runs in a fresh ``batchclient run`` process (remote provider, 64 in flight,
``max_tokens`` 1) against the stub server in another process; the peak RSS of that process is
read from ``wait4``'s rusage. The whole path is measured: upload, validation, the run, SQLite
commits, the output file.

    python bench/jobs_memory.py [--small 1000] [--large 100000]

Writes bench/results/jobs_memory.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _jobs_common import child_env, save, stub_process, write_input


def peak_rss_mb(url: str, n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        inp = write_input(tmp_path / "in.jsonl", n, max_tokens=1)
        out = tmp_path / "out.jsonl"
        cmd = [sys.executable, "-m", "batchclient.cli", "run", str(inp), "-o", str(out)]
        cmd += ["--base-url", url, "--state-dir", str(tmp_path / "state"), "--no-progress"]
        started = time.monotonic()
        proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"batchclient run failed with {proc.returncode} on {n} lines")
        lines = sum(1 for _ in out.open("rb"))
        assert lines == n, f"{lines} output lines for {n} requests"
        return {
            "lines": n,
            "peak_rss_mb": usage.ru_maxrss / 1024,  # Linux: kilobytes
            "wall_s": wall,
            "requests_per_s": n / wall,
            "input_mb": inp.stat().st_size / 1e6,
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", type=int, default=1000)
    p.add_argument("--large", type=int, default=100_000)
    args = p.parse_args()
    with stub_process() as url:
        small = peak_rss_mb(url, args.small)
        large = peak_rss_mb(url, args.large)
    apart = large["peak_rss_mb"] - small["peak_rss_mb"]
    path = save(
        "jobs_memory",
        {"small": small, "large": large, "apart_mb": apart, "goal_at_most_150_mb": apart <= 150},
    )
    print(
        f"peak RSS: {args.small} lines {small['peak_rss_mb']:.0f} MB, {args.large} lines "
        f"{large['peak_rss_mb']:.0f} MB ({large['requests_per_s']:.0f} req/s); apart "
        f"{apart:.0f} MB (goal <= 150 MB: {apart <= 150})\nwrote {path}"
    )


if __name__ == "__main__":
    main()
