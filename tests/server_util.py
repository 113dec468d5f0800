"""Helpers of the server tests: apps on real uvicorn servers, the SDK's shapes, polling."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
from pydantic import BaseModel

from batchclient.remote import RemoteProvider
from batchclient.server import create_app
from batchclient.testing import AppServer
from jobs_util import jsonl, line, wait_sync

KEY_A = "key-a-0123456789abcdef"
KEY_B = "key-b-fedcba9876543210"
TERMINAL = ("completed", "failed", "cancelled", "expired")


@contextmanager
def served(stub_url: str, state: Path, **options: Any) -> Iterator[str]:
    """``create_app(RemoteProvider(stub_url), state_dir=state, **options)`` on uvicorn; yields
    the base URL (without ``/v1``)."""
    provider = RemoteProvider(stub_url, max_concurrency=options.pop("max_concurrency", 64))
    with AppServer(create_app(provider, state_dir=state, **options)) as url:
        yield url


def sdk(url: str, key: str | None = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key or "none", max_retries=0, timeout=30)


def http(url: str, key: str | None = KEY_A) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def batch_file(n: int, prefix: str = "r", **body: Any) -> bytes:
    return jsonl([line(f"{prefix}{i}", f"{prefix} {i}", **body) for i in range(n)])


def shaped(model: type[BaseModel], raw: dict[str, Any]) -> Any:
    """``raw`` validated as the SDK's ``model``, with exactly the SDK's fields (and a running
    batch's ``progress``, the one extension the SDK keeps in ``model_extra``)."""
    running = raw.get("status") in ("in_progress", "finalizing")
    keys = set(raw) - ({"progress"} if running else set())
    assert keys == set(model.model_fields), keys ^ set(model.model_fields)
    return model.model_validate(raw)


def finished(batch: Any) -> int:
    """``completed + failed`` of an SDK ``Batch``."""
    counts = batch.request_counts
    assert counts is not None
    return int(counts.completed + counts.failed)


def wait_batch(client: openai.OpenAI, batch_id: str, within: float = 60.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in TERMINAL:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.05)


def is_envelope(response: httpx.Response) -> dict[str, Any]:
    """The error of an OpenAI error envelope, checked to have exactly its four fields."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


class Servers:
    """Several apps at once, all stopped at the end of the test."""

    def __init__(self, stub_url: str, root: Path) -> None:
        self.stub_url = stub_url
        self.root = root
        self.stack = ExitStack()

    def start(self, name: str = "state", **options: Any) -> str:
        return self.stack.enter_context(served(self.stub_url, self.root / name, **options))


BOUNDARY = "batchclient-test-boundary"
MULTIPART = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def multipart(parts: dict[str, str | bytes]) -> bytes:
    """A ``multipart/form-data`` body (boundary :data:`BOUNDARY`): bytes values are files."""
    out = b""
    for name, value in parts.items():
        disposition = f'form-data; name="{name}"'
        if isinstance(value, bytes):
            disposition += '; filename="in.jsonl"'
            payload = value
        else:
            payload = value.encode()
        out += f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        out += payload + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


WINDOW = 8
"""Requests in flight of the servers :func:`spawn` starts."""


def spawn(stub_url: str, state: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    """``batchclient serve`` over ``stub_url`` with key :data:`KEY_A`, as a child process
    logging to a file next to ``state``."""
    log = (state.parent / f"serve-{port}-{time.monotonic_ns()}.log").open("wb")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    args = ["serve", "--base-url", stub_url, "--port", str(port), "--state-dir", str(state),
            "--api-key", KEY_A, "--max-concurrency", str(WINDOW), *extra]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "batchclient.cli", *args], env=env, stdout=log, stderr=log
    )


def ready(url: str, proc: subprocess.Popen[bytes], **client: object) -> None:
    """Wait until the server at ``url`` answers (``client``: more ``httpx.get`` arguments)."""

    def answers() -> bool:
        assert proc.poll() is None, "the server exited"
        try:
            headers = {"Authorization": f"Bearer {KEY_A}"}
            return httpx.get(f"{url}/v1/models", headers=headers, **client).is_success  # type: ignore[arg-type]
        except httpx.TransportError:
            return False

    wait_sync(answers, timeout=60, every=0.1)
