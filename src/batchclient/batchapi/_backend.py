"""``RemoteBatchBackend``: one provider's batch API, as the one engine of this package runs it
(the OpenAI Files + Batches API and the APIs shaped like it, Anthropic Message Batches,
Gemini batches).

A backend only speaks its provider's wire. The runner (:class:`~._runner.RemoteRunner`) owns the
rest: it splits a job's input into parts of at most ``limits`` lines and bytes, writes each
part's file through :meth:`RemoteBatchBackend.encode` (one provider request per line, sent under
:meth:`RemoteBatchBackend.wire_id`), records each part before the remote call that gives it an
id, uploads, creates, polls, collects and resubmits.

Results come back from :meth:`RemoteBatchBackend.results` as a file of *normalised lines*, one
JSON object per request, in any order, in the OpenAI batch output shape (so collecting,
ordering and decoding are one code for every backend), written with :func:`ok_line`,
:func:`error_line`, :func:`unrun_line` and :func:`rest_line`:

- ``{"custom_id", "response": {"status_code", "body", "request_id"}}``: an answer (2xx, or the
  HTTP error the request got);
- ``{"custom_id", "error": {"code", "message", "param"}}``: a per-item error;
  ``batch_expired`` / ``batch_cancelled``: a request the batch did not run;
- ``"line": n`` instead of ``custom_id``: the n-th request (1-based) of the part's file (the
  validation errors of a failed OpenAI batch name lines, not ids);
- ``{"rest": true, "error": ...}``: what every request the file does not name got (a batch
  that failed as a whole);
- ``"retryable": true``: the request may succeed in a later batch (429, 5xx, overloaded, a
  batch that failed without naming it); it is resubmitted while attempts are left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import orjson

from .._core.request import Result, failed
from .._core.responses import Unsupported, to_chat
from ..errors import ConfigurationError, ErrorCode
from ..jobs._validate import RequestLine
from ..types import Endpoint
from ._parts import Limits

__all__ = [
    "RemoteBatchBackend",
    "RemoteState",
    "chat_encoder",
    "check_header_value",
    "error_line",
    "json_lines",
    "ok_line",
    "rest_line",
    "unrun_line",
]

RemoteStatus = Literal["in_progress", "cancelling", "ended"]


@dataclass(frozen=True)
class RemoteState:
    """A remote batch as last polled. ``status``: ``in_progress``, ``cancelling`` or ``ended``
    (its results can be read). ``completed`` / ``failed``: requests known finished so far (0
    when the provider counts only at the end). ``cancelled``: the batch was cancelled (by this
    client stopping its job, or by someone else: then what it did not run is not resubmitted).
    ``partial``: the batch ended without running everything, and a request missing from its
    results was not run (expired, cancelled) rather than lost."""

    status: RemoteStatus
    completed: int = 0
    failed: int = 0
    cancelled: bool = False
    partial: bool = False

    @property
    def ended(self) -> bool:
        return self.status == "ended"


def check_header_value(name: str, value: str) -> str:
    """Refuse a header value that could split the request (CR, LF, NUL)."""
    if any(c in value for c in "\r\n\0"):
        raise ConfigurationError(f"{name} contains a line break or NUL")
    return value


def _line(key: dict[str, Any], retryable: bool, **fields: Any) -> bytes:
    if retryable:
        fields["retryable"] = True
    return orjson.dumps({**key, **fields}) + b"\n"


def ok_line(
    wire: str, translate: Callable[[], dict[str, Any]], request_id: str | None = None
) -> bytes:
    """A normalised answer: the body ``translate()`` gives in the OpenAI shape of the job's
    endpoint (a ``chat.completion`` for chat); an answer it cannot read (it raises) or that JSON
    cannot hold is the request's ``bad_upstream_response``."""
    try:
        response = {"status_code": 200, "body": translate(), "request_id": request_id}
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:
        why = f"the remote batch's answer is malformed: {type(exc).__name__}: {exc}"[:300]
        return error_line(wire, "bad_upstream_response", why)
    try:
        return _line({"custom_id": wire}, False, response=response)
    except TypeError as exc:  # orjson: an integer over 64 bits, a value that is not JSON
        return error_line(wire, "bad_upstream_response", f"the answer cannot be kept: {exc}")


def error_line(
    wire: str | int, code: str, message: str, *, retryable: bool = False, param: str | None = None
) -> bytes:
    """A normalised per-item error (``code`` an :class:`~batchclient.ErrorCode` value);
    ``wire`` an ``int``: the request on that line (1-based) of the part's file."""
    key: dict[str, Any] = {"line": wire} if isinstance(wire, int) else {"custom_id": wire}
    error = {"code": code, "message": message, "param": param}
    return _line(key, retryable, error=error)


def unrun_line(wire: str, why: Literal["expired", "cancelled"]) -> bytes:
    """A request the batch did not run (it expired, or was cancelled first): resubmitted while
    attempts are left, unless its batch was cancelled."""
    code = "batch_expired" if why == "expired" else "batch_cancelled"
    error = {"code": code, "message": f"the remote batch {why} before running this request"}
    return _line({"custom_id": wire}, False, error=error)


def rest_line(code: str, message: str, *, retryable: bool) -> bytes:
    """What every request the results do not name got (a batch that failed as a whole)."""
    return _line({"rest": True}, retryable, error={"code": code, "message": message})


def json_lines(path: Path) -> Iterator[Any]:
    """The JSON values of a downloaded results file, one a line; a line that is not JSON names
    no request and is left out (its request then reads as missing)."""
    with path.open("rb") as f:
        for line in f:
            try:
                yield orjson.loads(line)
            except orjson.JSONDecodeError:
                continue


class RemoteBatchBackend(Protocol):
    """One provider's batch API. Every async method is one attempt at one remote call (the
    runner retries); each raises :class:`~._retry.ApiError` when it fails."""

    name: str
    """The provider's registry name (``batch-api``, ``anthropic-batch``, ``gemini-batch``)."""
    base_url: str
    """The API root, without credentials (as shown and stored)."""
    endpoints: frozenset[Endpoint]
    """The endpoints its batches serve."""
    limits: Limits
    """The most requests and part-file bytes in one remote batch (a little under the
    provider's caps: the request that carries the file adds its own bytes)."""

    def identity(self) -> dict[str, Any]:
        """What tells two endpoints apart (provider name, base URL), for call and job keys."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def models(self) -> set[str] | None:
        """The model names served, or None when they cannot be listed."""
        ...

    async def context_length(self, model: str) -> int | None:
        """``model``'s context in tokens where the API lists it (vLLM's ``max_model_len``),
        else None."""
        ...

    def wire_id(self, line: RequestLine) -> str:
        """The id ``line`` is sent under (its ``custom_id``, or its line number where the
        provider restricts ids; Anthropic: ``^[a-zA-Z0-9_-]{1,64}$``)."""
        ...

    def encode(self, line: RequestLine, endpoint: str) -> bytes | Result:
        """One line of a part's file for ``line``, or a failed :class:`Result` (e.g.
        ``unsupported_parameter``) that becomes the line's own error. Pure: called again with
        the same line after a crash or to resubmit."""
        ...

    async def upload(self, path: Path, lines: int, marks: dict[str, str]) -> str | None:
        """Upload the part's file at ``path`` (``lines`` requests) where a create can name
        it; its remote id, or None where the create carries the requests itself."""
        ...

    async def submit(
        self, upload: str | None, path: Path, endpoint: str, window: str, marks: dict[str, str]
    ) -> str:
        """Create a remote batch of the part (its ``upload``, or the file at ``path``) for
        ``endpoint`` within ``window``; its remote id. Not idempotent: after an ambiguous
        failure the runner calls :meth:`find` first. ``marks`` (job id, part number) label
        the batch where the provider keeps labels."""
        ...

    async def find(
        self, upload: str | None, marks: dict[str, str], lines: int, since: float
    ) -> str | None:
        """The remote batch a lost create answer made: labelled ``marks``, over ``upload``,
        or (providers without labels) of ``lines`` requests created at or after ``since``
        (Unix seconds); None when there is none (or it cannot be told)."""
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


def chat_encoder(backend: RemoteBatchBackend) -> Callable[[RequestLine, str], bytes | Result]:
    """``backend.encode``, with a ``/v1/responses`` line sent as the chat request it stands
    for where the backend's batches serve chat only (Anthropic, Gemini); its answer becomes a
    ``Response`` again when its row is stored (``jobs._output.row_for``)."""
    if Endpoint.responses in backend.endpoints:
        return backend.encode
    responses, chat = Endpoint.responses.value, Endpoint.chat_completions.value

    def encode(line: RequestLine, endpoint: str) -> bytes | Result:
        if endpoint != responses:
            return backend.encode(line, endpoint)
        try:
            body = to_chat(line.body)
        except Unsupported as exc:
            return failed(ErrorCode.unsupported_parameter, exc.message, param=exc.param)
        return backend.encode(replace(line, body=body), chat)

    return encode
