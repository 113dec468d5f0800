"""A big batch file with many duplicate lines through one ``batchclient serve``, and what the
other tenant sees meanwhile.

The stub server in its own process (no latency), ``batchclient serve`` with two keys in
another. Tenant A uploads a ``--lines``-line file of greedy chat requests (``temperature`` 0) in
which only ``--distinct`` of every 10 lines are distinct (the default 1 of 10: 90 % duplicates,
merged into their first copy and never sent; 0: every line the same), creates a batch, and
polls it every second until it ends. All the while tenant B sends ``GET /v1/batches?limit=1``
one after another (10 ms apart): every event-loop stall of the server shows in B's latencies.

Reported: A's upload and batch seconds (create to ``completed``), the lines per second, the
output file's line count, and B's median, p99 and worst latency per phase (upload, the batch's
``validating`` state, ``in_progress``, and the whole run), and the server's peak RSS.

    python bench/server_big_file.py [--lines 1000000] [--distinct 1] [serve options...]

Writes bench/results/server_big_file[_<lines/1000>k][_distinct<d>][_<label>].json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from _jobs_common import save, stub_process
from _server_common import PeakRss, add_src_options, serve, use_src

KEY_A = "bench-tenant-a-0123456789"
KEY_B = "bench-tenant-b-9876543210"


def write_file(path: Path, lines: int, distinct: int) -> Path:
    """``lines`` lines in which line ``i`` asks prompt ``(i // 10) * distinct + i % distinct``:
    ``distinct`` distinct prompts per 10 lines, each copy 10 lines or more after the first
    (``distinct`` 0: one prompt for all)."""
    with path.open("w") as f:
        for i in range(lines):
            prompt = (i // 10) * distinct + i % 10 % distinct if distinct else 0
            body = {
                "model": "smollm2",
                "messages": [{"role": "user", "content": f"Question {prompt}?"}],
                "max_tokens": 4,
                "temperature": 0,
            }
            row = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
            f.write(json.dumps({**row, "body": body}, separators=(",", ":")) + "\n")
    return path


class Probe:
    """Tenant B's ``GET /v1/batches?limit=1`` loop in a thread: ``(phase, seconds)`` samples."""

    def __init__(self, url: str) -> None:
        self.phase = "idle"
        self.samples: list[tuple[str, float]] = []
        self._stop = threading.Event()
        self._client = httpx.Client(
            base_url=f"{url}/v1", headers={"Authorization": f"Bearer {KEY_B}"}, timeout=60
        )
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self._client.get("/batches", params={"limit": 1}).raise_for_status()
            self.samples.append((self.phase, time.perf_counter() - started))
            time.sleep(0.01)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()

    def summary(self, phase: str | None = None) -> dict[str, Any]:
        values = sorted(s for p, s in self.samples if phase is None or p == phase)
        if not values:
            return {"n": 0}
        return {
            "n": len(values),
            "median_ms": statistics.median(values) * 1000,
            "p99_ms": values[min(len(values) - 1, int(len(values) * 0.99))] * 1000,
            "max_ms": values[-1] * 1000,
        }


def measure(lines: int, distinct: int, extra: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as name, stub_process() as stub:
        tmp = Path(name)
        path = write_file(tmp / "big.jsonl", lines, distinct)
        keys = ("--api-key", KEY_A, "--api-key", KEY_B, "--max-upload-mib", "1024")
        with serve(stub, tmp / "state", *keys, *extra) as (url, proc):
            a = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY_A, max_retries=0, timeout=600)
            with PeakRss(proc.pid, every_s=0.05) as rss, Probe(url) as probe:
                time.sleep(2)  # B's latency on an idle server
                probe.phase = "upload"
                t0 = time.perf_counter()
                with path.open("rb") as f:
                    file_id = a.files.create(file=f, purpose="batch").id
                upload_s = time.perf_counter() - t0
                probe.phase = "validating"
                t0 = time.perf_counter()
                batch = a.batches.create(
                    input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
                )
                validating_s = None
                while batch.status not in ("completed", "failed", "cancelled", "expired"):
                    time.sleep(1)
                    batch = a.batches.retrieve(batch.id)
                    if batch.status != "validating" and validating_s is None:
                        validating_s = time.perf_counter() - t0
                        probe.phase = "in_progress"
                batch_s = time.perf_counter() - t0
                probe.phase = "after"
            assert batch.status == "completed", batch
            assert batch.output_file_id is not None
            t0 = time.perf_counter()
            output = a.files.content(batch.output_file_id).read()
            download_s = time.perf_counter() - t0
    counts = batch.request_counts
    return {
        "lines": lines,
        "duplicate_share": 1 - distinct / 10,
        "upload_s": upload_s,
        "validating_s": validating_s,
        "batch_s": batch_s,
        "lines_per_s": lines / batch_s,
        "download_s": download_s,
        "output_lines": output.count(b"\n"),
        "request_counts": counts.model_dump() if counts is not None else None,
        "server_peak_rss_mib": rss.peak / 2**20,
        "b_latency": {
            phase: probe.summary(phase) for phase in ("idle", "upload", "validating", "in_progress")
        }
        | {"all": probe.summary()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--distinct", type=int, default=1, help="distinct prompts per 10 lines")
    add_src_options(p)
    args, extra = p.parse_known_args()
    use_src(args.src)
    result = measure(args.lines, args.distinct, extra)
    print(json.dumps(result, indent=2))
    name = "server_big_file" + (f"_{args.lines // 1000}k" if args.lines != 1_000_000 else "")
    name += f"_distinct{args.distinct}" if args.distinct != 1 else ""
    save(name + (f"_{args.label}" if args.src else ""), result)


if __name__ == "__main__":
    main()
