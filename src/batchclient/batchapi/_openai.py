"""The OpenAI Files + Batches API (and the flavours shaped like it: Together, Groq, Mistral,
another ``batchclient serve``) as a :class:`~._backend.RemoteBatchBackend`.

- a part's file is uploaded (``POST /files``), then a batch created over it (``POST
  /batches`` with ``metadata`` naming the job and part); a create whose answer was lost is
  found again in ``GET /batches`` by that metadata and the uploaded file (Together keeps no
  metadata: by the file alone, which is unique per part);
- polls read ``GET /batches/{id}``: ``validating`` / ``in_progress`` / ``finalizing`` run on,
  ``completed``, ``failed``, ``expired`` and ``cancelled`` have ended;
- results are the output and error files, already in the normalised shape; a line answered
  429 or 5xx (or an error line saying the server could not be reached) is marked retryable.
  A ``failed`` batch has no files: its validation errors go to the lines they name (final),
  and every other line is retryable.

Requests go under their own ``custom_id`` (what the provider's console shows). The wire is
:class:`~._api.BatchAPI` (aiohttp; ``docs/design.md`` says why not the openai SDK).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import orjson
from anyio import to_thread

from .._core.request import Result
from .._routing.retry import RETRYABLE_STATUS
from ..jobs._validate import RequestLine
from ..types import BatchStatus, Endpoint
from ._api import BatchAPI, RemoteBatch
from ._backend import RemoteState, error_line, rest_line
from ._options import BatchAPIOptions
from ._parts import Limits, batch_line, private_file
from ._retry import Retrier

__all__ = ["OpenAIBackend"]

_RUNNING = frozenset({BatchStatus.validating, BatchStatus.in_progress, BatchStatus.finalizing})
_RETRYABLE_CODES = frozenset(
    {"rate_limited", "server_error", "timeout", "connection_error", "endpoint_unavailable"}
)
"""Codes of an error line without a response that a later batch may not get (a
``batchclient serve`` writes them for an upstream it could not reach)."""


class OpenAIBackend:
    """One OpenAI-shaped Batch API root (``base_url`` ends in ``/v1``). Arguments as
    :class:`~batchclient.BatchAPIBatchInference`; ``limits`` None: the flavour's."""

    name = "batch-api"
    endpoints: frozenset[Endpoint] = frozenset(Endpoint)

    def __init__(self, base_url: str, api_key: str | None, options: BatchAPIOptions) -> None:
        self.api = BatchAPI(
            base_url, api_key, headers=options["headers"], timeout_s=options["timeout_s"],
            retrier=Retrier(options["max_retries"], options["retry"]), flavor=options["flavor"],
        )  # fmt: skip
        spec = self.api.flavor
        self.flavor = spec.name
        self.base_url = self.api.display  # without userinfo or secret query values
        self.limits = Limits(
            options["max_lines"] or spec.max_lines, options["max_bytes"] or spec.max_bytes
        )

    def identity(self) -> dict[str, Any]:
        identity: dict[str, Any] = {"provider": "batch-api", "base_url": self.base_url}
        if self.flavor != "openai":  # the default stays out: earlier calls keep their keys
            identity["flavor"] = self.flavor
        return identity

    async def start(self) -> None:
        await self.api.start()

    async def stop(self) -> None:
        await self.api.stop()

    async def models(self) -> set[str] | None:
        cards = await self.api.models()
        return None if cards is None else set(cards)

    async def context_length(self, model: str) -> int | None:
        limit = ((await self.api.models()) or {}).get(model, {}).get("max_model_len")
        return limit if isinstance(limit, int) and not isinstance(limit, bool) else None

    def wire_id(self, line: RequestLine) -> str:
        return line.custom_id

    def encode(self, line: RequestLine, endpoint: str) -> bytes | Result:
        return batch_line(line.custom_id, endpoint, line.body)

    async def upload(self, path: Path, lines: int, marks: dict[str, str]) -> str | None:
        name = f"{marks.get('batchclient_job', 'batch')}-part{marks.get('batchclient_part', 0)}"
        return await self.api.upload(path, f"{name}.jsonl")

    async def submit(
        self, upload: str | None, path: Path, endpoint: str, window: str, marks: dict[str, str]
    ) -> str:
        assert upload is not None  # every part is uploaded first
        return (await self.api.create(upload, endpoint, window, marks)).id

    async def find(
        self, upload: str | None, marks: dict[str, str], lines: int, since: float
    ) -> str | None:
        if upload is None:
            return None
        found = await self.api.find(upload, marks)
        return None if found is None else found.id

    async def poll(self, remote_id: str) -> RemoteState:
        return _state(await self.api.retrieve(remote_id))

    async def results(self, remote_id: str, dest: Path) -> None:
        batch = await self.api.retrieve(remote_id)
        if batch.status == BatchStatus.failed:
            await to_thread.run_sync(_write_failure, batch, dest)
            return
        raw = dest.with_name(dest.name + ".raw")
        try:
            await to_thread.run_sync(lambda: private_file(dest).close())
            for file_id in (batch.output_file_id, batch.error_file_id):
                if file_id:
                    await self.api.download(file_id, raw)
                    await to_thread.run_sync(_append_marked, raw, dest)
        finally:
            await anyio.Path(raw).unlink(missing_ok=True)

    async def cancel(self, remote_id: str) -> None:
        await self.api.cancel(remote_id)


def _state(batch: RemoteBatch) -> RemoteState:
    counts = batch.request_counts
    done = (counts.completed, counts.failed) if counts else (0, 0)
    if batch.status in _RUNNING:
        return RemoteState("in_progress", *done)
    if batch.status == BatchStatus.cancelling:
        return RemoteState("cancelling", *done)
    # an expired or cancelled batch's error file may leave out what it did not run
    return RemoteState(
        "ended",
        *done,
        cancelled=batch.status == BatchStatus.cancelled,
        partial=batch.status in (BatchStatus.expired, BatchStatus.cancelled),
    )


def _write_failure(batch: RemoteBatch, dest: Path) -> None:
    """A failed batch's errors as normalised lines: those naming a line are final (a
    validation error), every other line may go through in a new batch."""
    errors = batch.errors.data if batch.errors else []
    first = next((e for e in errors if e.line is None), errors[0] if errors else None)
    detail = f": {first.code}: {first.message}" if first else ""
    with private_file(dest) as out:
        for e in errors:
            if e.line is not None:
                code = e.code or "invalid_request"
                message = e.message or "the remote batch refused this line"
                out.write(error_line(e.line, code, message, param=e.param))
        message = f"the remote batch {batch.id} failed{detail}"
        out.write(rest_line("batch_failed", message, retryable=True))


def _append_marked(raw: Path, dest: Path) -> None:
    """Append the downloaded output or error file ``raw`` to ``dest``, each line a request
    may get otherwise in a later batch marked ``retryable``."""
    with raw.open("rb") as src, dest.open("ab") as out:
        for line in src:
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                out.write(line.rstrip(b"\n") + b"\n")  # names no request: read as missing
                continue
            if _retryable(obj):
                obj["retryable"] = True
                line = orjson.dumps(obj)
            out.write(line.rstrip(b"\n") + b"\n")


def _retryable(obj: Any) -> bool:
    if not isinstance(obj, dict):
        return False
    response, error = obj.get("response"), obj.get("error")
    if isinstance(response, dict):
        return response.get("status_code") in RETRYABLE_STATUS
    return isinstance(error, dict) and error.get("code") in _RETRYABLE_CODES
