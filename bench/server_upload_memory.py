"""Peak RSS of ``batchclient serve`` while a 200 MB file is uploaded, over its idle RSS (goal:
at most +50 MB).

The server runs as its own process (remote provider over the stub, no keys); its RSS is
sampled every 5 ms with psutil from one second before the upload until the answer. The upload
is the openai SDK's ``files.create`` of a 200,000,000-byte JSONL file (valid request lines)
from disk; the server streams the multipart body into its state directory. The stored size is
checked.

    python bench/server_upload_memory.py [--mb 200]

Writes bench/results/server_upload_memory.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import openai
import psutil

from _jobs_common import request_line, save, stub_process
from _server_common import serve


def write_file(path: Path, size: int) -> int:
    """Request lines padded to about 1 KB each, ``size`` bytes in all."""
    pad = "x" * 900
    with path.open("w") as f:
        written, i = 0, 0
        while written < size:
            row = json.loads(request_line(i, max_tokens=8))
            row["body"]["messages"][0]["content"] += " " + pad
            text = json.dumps(row) + "\n"
            text = text[: size - written] if written + len(text) > size else text
            f.write(text)
            written += len(text.encode())
            i += 1
    return path.stat().st_size


class Sampler:
    """RSS of one process every ``every_s`` seconds, in a thread."""

    def __init__(self, pid: int, every_s: float = 0.005) -> None:
        self.process = psutil.Process(pid)
        self.every_s = every_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.process.memory_info().rss)
            time.sleep(self.every_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(mb: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as name, stub_process() as stub:
        tmp = Path(name)
        size = write_file(tmp / "big.jsonl", mb * 1_000_000)
        with serve(stub, tmp / "state") as (url, proc):
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
            client.models.list()
            client.files.create(file=("small.jsonl", b"{}\n"), purpose="batch")  # warm paths
            time.sleep(1.0)
            idle = max(psutil.Process(proc.pid).memory_info().rss for _ in range(20))
            with Sampler(proc.pid) as sampler:
                time.sleep(1.0)
                started = time.perf_counter()
                with (tmp / "big.jsonl").open("rb") as f:
                    record = client.files.create(file=f, purpose="batch", timeout=600)
                took = time.perf_counter() - started
            assert record.bytes == size, (record.bytes, size)
    peak = max(sampler.samples)
    return {
        "file_bytes": size,
        "idle_rss_mb": idle / 1e6,
        "peak_rss_mb": peak / 1e6,
        "peak_over_idle_mb": (peak - idle) / 1e6,
        "samples": len(sampler.samples),
        "upload_s": took,
        "upload_mb_per_s": size / 1e6 / took,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=200, help="file size, MB of 10^6 bytes (default 200)")
    args = p.parse_args()
    figures = measure(args.mb)
    figures["goal_at_most_50_mb"] = figures["peak_over_idle_mb"] <= 50
    path = save("server_upload_memory", figures)
    print(
        f"{figures['file_bytes'] / 1e6:.0f} MB upload in {figures['upload_s']:.1f} s "
        f"({figures['upload_mb_per_s']:.0f} MB/s): server RSS idle {figures['idle_rss_mb']:.1f} "
        f"MB, peak {figures['peak_rss_mb']:.1f} MB, +{figures['peak_over_idle_mb']:.1f} MB "
        f"(goal <= +50 MB: {figures['goal_at_most_50_mb']})\nwrote {path}"
    )


if __name__ == "__main__":
    main()
