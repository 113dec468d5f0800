"""Helpers of the server benchmarks: ``batchclient serve`` as a child process."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

import _jobs_common
from _jobs_common import child_env
from batchclient.testing import free_port


def start_serve(
    base_url: str, state: Path, *extra: str, log: Path | None = None, port: int | None = None
) -> tuple[str, subprocess.Popen[bytes]]:
    """Start ``batchclient serve --provider remote --base-url BASE_URL`` on a free loopback
    port (no keys); return its URL and process once ``GET /v1/models`` answers."""
    port = port or free_port()
    out = log.open("ab") if log is not None else subprocess.DEVNULL
    args = ["serve", "--base-url", base_url, "--port", str(port), "--state-dir", str(state),
            "--log-level", "warning", *extra]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "batchclient.cli", *args], env=child_env(), stdout=out, stderr=out
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"batchclient serve exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"{url}/v1/models", timeout=5).read()
            return url, proc
        except urllib.error.HTTPError:  # 401 with keys: it answers, so it is up
            return url, proc
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.1)


@contextlib.contextmanager
def serve(base_url: str, state: Path, *extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    url, proc = start_serve(base_url, state, *extra)
    try:
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_batch(client: Any, inp: Path, n: int, poll_s: float = 0.25) -> bytes:
    """Through the openai SDK ``client``: upload ``inp``, create a chat batch, poll it every
    ``poll_s`` until it ends, check that it completed its ``n`` lines; the output file."""
    with inp.open("rb") as f:
        upload = client.files.create(file=f, purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(poll_s)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.output_file_id, batch
    assert batch.request_counts is not None and batch.request_counts.completed == n, batch
    return bytes(client.files.content(batch.output_file_id).read())


def add_src_options(p: argparse.ArgumentParser) -> None:
    """``--src DIR`` (run the server from another source tree, to compare) and ``--label``."""
    p.add_argument("--src", default=None, help="run the server from this source tree")
    p.add_argument("--label", default="baseline", help="result name suffix with --src")


def use_src(src: str | None) -> None:
    """Run the servers this benchmark starts from ``src`` (a checkout's ``src`` folder)."""
    if src:
        _jobs_common.SRC = Path(src).resolve()
        os.environ["PYTHONPATH"] = str(_jobs_common.SRC)


class PeakRss:
    """Peak RSS of one process (bytes, ``peak``), sampled every ``every_s`` seconds in a thread
    while the ``with`` block runs."""

    def __init__(self, pid: int, every_s: float = 0.005) -> None:
        self.process = psutil.Process(pid)
        self.every_s = every_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.every_s)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
