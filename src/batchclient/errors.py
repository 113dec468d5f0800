"""One exception hierarchy for whole-call problems, and the codes of per-item errors.

Per-item failures never raise: they become ``ChatCompletionResponse.error`` (a
``BatchItemError``) at the item's position, and the other items finish. Exceptions are for the
whole call (``docs/design.md``, "Errors")::

    BatchClientError
    ├── ConfigurationError       bad constructor argument, missing optional dependency
    ├── ModelNotFoundError       the call names a model the provider does not serve
    ├── ClientClosedError        the client is used outside its ``async with`` block
    ├── EndpointError            no server reachable at all, or an engine's start-up failure
    ├── BatchFailedError         raised only on request (``raise_on_error=True``): some items failed
    ├── JobError                 job calls
    │   ├── JobNotFoundError
    │   └── JobStateError        e.g. cancelling a completed job (OpenAI answers 409)
    └── FileNotFoundInStoreError unknown file id
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .types import BatchItemError

__all__ = [
    "BatchClientError",
    "BatchFailedError",
    "ClientClosedError",
    "ConfigurationError",
    "EndpointError",
    "ErrorCode",
    "FileNotFoundInStoreError",
    "JobError",
    "JobNotFoundError",
    "JobStateError",
    "ModelNotFoundError",
]


class ErrorCode(StrEnum):
    """Codes of per-item errors (``BatchItemError.code``).

    Every per-item error carries one of these, whatever the upstream API called it, so eval code
    can branch on them; the upstream's own error body (``message``, ``type``, ``code``) is kept in
    ``message`` and in job error files. Names follow the OpenAI API and Batch API where one exists.
    """

    invalid_request = "invalid_request"  # the request cannot be served as given (HTTP 400/422)
    context_length_exceeded = "context_length_exceeded"  # prompt (+ max_tokens) over the context
    model_not_found = "model_not_found"  # the server or engine does not serve that model
    unsupported_parameter = "unsupported_parameter"  # a field the provider cannot honour
    authentication_error = "authentication_error"  # HTTP 401
    permission_denied = "permission_denied"  # HTTP 403
    not_found = "not_found"  # HTTP 404 that is not a model error
    rate_limited = "rate_limited"  # HTTP 429 or 498 after every retry (never reported as a 5xx)
    server_error = "server_error"  # HTTP 5xx after every retry
    http_error = "http_error"  # any other HTTP status
    bad_upstream_response = "bad_upstream_response"  # 2xx without a usable ChatCompletion body
    response_too_large = "response_too_large"  # an answer over the transport's size cap
    timeout = "timeout"  # no answer within the timeout, counted from dispatch
    connection_error = "connection_error"  # could not connect, or the connection dropped
    endpoint_unavailable = "endpoint_unavailable"  # every replica ejected / down
    engine_error = "engine_error"  # the inline engine failed this request
    internal_error = "internal_error"  # a bug in batchclient while handling this item
    invalid_structured_output = "invalid_structured_output"  # answer does not match its schema
    invalid_tool_call = "invalid_tool_call"  # tool call arguments do not match the tool's schema
    batch_cancelled = "batch_cancelled"  # job cancelled before this request finished
    batch_expired = "batch_expired"  # job's completion window passed first
    # the job failed as a whole (see its errors; on a remote Batch API: the remote batch that
    # held this request failed) before this request finished
    batch_failed = "batch_failed"
    # Job-level failures after validation (``Batch.errors``); the job can be resumed.
    output_write_failed = "output_write_failed"  # the output or error file could not be written
    storage_error = "storage_error"  # the state directory failed under the job (disk full, ...)
    # Input-file validation (OpenAI Batch API codes).
    invalid_json_line = "invalid_json_line"
    missing_required_parameter = "missing_required_parameter"
    invalid_url = "invalid_url"
    streaming_unsupported = "streaming_unsupported"
    duplicate_custom_id = "duplicate_custom_id"
    empty_file = "empty_file"
    mismatched_model = "mismatched_model"
    invalid_encoding = "invalid_encoding"


class BatchClientError(Exception):
    """Base of every exception batchclient raises."""


class ConfigurationError(BatchClientError, ValueError):
    """A bad argument to a constructor or call, or a missing optional dependency."""


class ModelNotFoundError(BatchClientError, ValueError):
    """The call names a model the provider does not serve. ``available`` lists those it does."""

    def __init__(self, model: str, available: list[str]):
        self.model = model
        self.available = available
        super().__init__(f"model {model!r} is not served here; available: {', '.join(available)}")


class ClientClosedError(BatchClientError, RuntimeError):
    """The client is used outside its ``async with`` block."""


class EndpointError(BatchClientError, ConnectionError):
    """No server is usable at all, or a server or engine failed to start."""


class BatchFailedError(BatchClientError):
    """Raised by ``batch_chat_completion(..., raise_on_error=True)`` when any item failed.

    ``response`` holds the whole ordered result, successes included; ``errors`` the
    ``(index, BatchItemError)`` pairs.
    """

    def __init__(self, response: object, errors: list[tuple[int, BatchItemError]]):
        self.response = response
        self.errors = errors
        first = errors[0][1] if errors else None
        detail = f"; first: item {errors[0][0]}: {first.code}: {first.message}" if first else ""
        super().__init__(f"{len(errors)} item(s) failed{detail}")


class JobError(BatchClientError):
    """A job call failed."""


class JobNotFoundError(JobError, KeyError):
    """No job with that id in this client's state directory."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "job not found"


class JobStateError(JobError):
    """The job is in a state that does not allow the call (OpenAI answers HTTP 409)."""


class FileNotFoundInStoreError(BatchClientError, KeyError):
    """No file with that id in this client's state directory."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "file not found"
