"""``RemoteBatchBackend``: what another provider's batch API implements to run on the durable
machinery of :mod:`batchclient.batchapi` (parts and remote ids in the state directory,
resubmission, polling with backoff, re-attach on the next ``async with``, cancel keeping what
finished).

A backend only speaks its provider's wire. The runner (:class:`~._backend_runner.BackendRunner`)
owns everything else: it splits a job's input into parts of at most ``limits`` lines and bytes,
writes each part's file through :meth:`RemoteBatchBackend.encode` (one provider request per
line, sent under the line's *wire id*: its input line number, which every provider's id rules
accept), records each part before the remote call that gives it an id, polls, collects and
resubmits.

Results come back from :meth:`RemoteBatchBackend.results` as a file of *normalised lines*, one
JSON object per request, in any order (written with :func:`ok_line`, :func:`error_line` and
:func:`unrun_line`): the OpenAI batch output shape, so collection, ordering and decoding are
shared with the OpenAI Batch API.

Errors: a backend raises :class:`~._api.ApiError` (``status``, ``transient``,
``retry_after_s``) for a call that failed; the runner retries transient ones with
:class:`~._api.Retrier` backoff (``Retry-After`` first), polls without limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import orjson

from .._core.request import Result
from ..jobs import RequestLine
from ._parts import Limits
from ._retry import Retrier

__all__ = [
    "RemoteBatchBackend",
    "RemoteState",
    "error_line",
    "ok_line",
    "unrun_line",
    "wire_id",
]

RemoteStatus = Literal["in_progress", "cancelling", "ended"]


@dataclass(frozen=True)
class RemoteState:
    """A remote batch as last polled. ``status``: ``in_progress``, ``cancelling`` or ``ended``
    (every request has a result: succeeded, errored, expired or cancelled; results can be
    read). ``completed`` / ``failed``: requests known finished so far (0 when the provider
    counts only at the end). ``cancelled``: someone cancelled the batch (for the runner: not a
    reason to resubmit when it was this client stopping the job). ``partial``: the batch ended
    without running everything and its results cannot name what it skipped (Gemini returns
    only what it answered): a request missing from them was not run, rather than lost."""

    status: RemoteStatus
    completed: int = 0
    failed: int = 0
    cancelled: bool = False
    partial: bool = False

    @property
    def ended(self) -> bool:
        return self.status == "ended"


def wire_id(line: RequestLine) -> str:
    """The id a job's input line is sent under: its line number (``custom_id`` values may be
    any string; providers restrict theirs, e.g. Anthropic to ``^[a-zA-Z0-9_-]{1,64}$``)."""
    return str(line.seq)


def ok_line(wire: str, body: dict[str, Any], request_id: str | None = None) -> bytes:
    """A normalised result line: an answer, already in the OpenAI shape of the job's endpoint
    (a ``chat.completion`` body for chat)."""
    response = {"status_code": 200, "body": body, "request_id": request_id}
    return orjson.dumps({"custom_id": wire, "response": response}) + b"\n"


def error_line(
    wire: str, code: str, message: str, *, retryable: bool = False, param: str | None = None
) -> bytes:
    """A normalised result line: a per-item error (``code`` an :class:`~batchclient.ErrorCode`
    value). ``retryable``: the runner submits the request again in a later batch (while
    attempts are left) instead of committing the error."""
    error = {"code": code, "message": message, "retryable": retryable, "param": param}
    return orjson.dumps({"custom_id": wire, "error": error}) + b"\n"


def unrun_line(wire: str, why: Literal["expired", "cancelled"]) -> bytes:
    """A normalised result line: a request the batch did not run (it expired, or was
    cancelled first). It stays unfinished: resubmitted while attempts are left, unless the job
    itself is being cancelled."""
    code = "batch_expired" if why == "expired" else "batch_cancelled"
    error = {"code": code, "message": f"the remote batch {why} before running this request"}
    return orjson.dumps({"custom_id": wire, "error": error}) + b"\n"


class RemoteBatchBackend(Protocol):
    """One provider's batch API. Every async method is one attempt at one remote call (the
    runner retries, with ``retrier``); each raises :class:`~._api.ApiError` when it fails."""

    limits: Limits
    """The most requests and part-file bytes in one remote batch (set them a little under the
    provider's caps: the request that carries the file adds its own bytes)."""
    retrier: Retrier
    """Retries and backoff for this backend's calls (``max_retries``, ``RetryPolicy``)."""
    poll_interval_s: float
    """Seconds between two polls of one remote batch."""

    def identity(self) -> dict[str, Any]:
        """What tells two endpoints apart (provider name, base URL), for call keys."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def encode(self, line: RequestLine, endpoint: str) -> bytes | Result:
        """One line of a part's file for ``line`` (sent under :func:`wire_id`), or a failed
        :class:`Result` (e.g. ``unsupported_parameter``) that becomes the line's own error. Pure:
        called again with the same line after a crash or to resubmit."""
        ...

    async def submit(self, path: Path, lines: int, marks: dict[str, str]) -> str:
        """Create a remote batch from the part file at ``path`` (``lines`` requests); its remote
        id. Not idempotent: after an ambiguous failure the runner calls :meth:`find` first.
        ``marks`` (job id, part number) label the batch where the provider keeps labels."""
        ...

    async def find(self, marks: dict[str, str], lines: int, since: float) -> str | None:
        """The remote batch a lost create answer made: labelled ``marks``, or (providers
        without labels) of ``lines`` requests created at or after ``since`` (Unix seconds);
        None when there is none (or it cannot be told)."""
        ...

    async def poll(self, remote_id: str) -> RemoteState: ...

    async def results(self, remote_id: str, dest: Path) -> None:
        """Write an ended batch's results to ``dest`` (mode 0600: answers are as private as
        prompts) as normalised lines, one per request, in any order."""
        ...

    async def cancel(self, remote_id: str) -> None:
        """Ask the provider to cancel; a batch that already ended may refuse (the runner
        ignores that)."""
        ...
