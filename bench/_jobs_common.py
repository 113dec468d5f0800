"""Helpers of the job benchmarks: a stub server in its own process, input files, results."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
SRC = Path(__file__).parents[1] / "src"

_STUB_CODE = """
import sys, time
from batchclient.testing import StubServer
stub = StubServer(latency_s=float(sys.argv[1]), jitter_s=float(sys.argv[2])).start()
print(stub.url, flush=True)
sys.stdin.read()  # until the parent closes our stdin
stub.stop()
"""


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC)}


@contextlib.contextmanager
def stub_process(latency_s: float = 0.0, jitter_s: float = 0.0) -> Iterator[str]:
    """The fault-free stub in its own process (its own core); yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _STUB_CODE, str(latency_s), str(jitter_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=child_env(),
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        urllib.request.urlopen(f"{url}/models", timeout=10).read()
        yield url
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def request_line(i: int, *, max_tokens: int, model: str = "smollm2") -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Request number {i}: say something."}],
        "max_tokens": max_tokens,
    }
    return json.dumps(
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
    )


def write_input(path: Path, n: int, *, max_tokens: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(request_line(i, max_tokens=max_tokens) + "\n")
    return path


def save(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        **data,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
