"""The internal request and result every provider speaks.

- :class:`Request`: one item to run, as an OpenAI request body for its ``endpoint``
  (``/v1/chat/completions`` today's calls; ``/v1/completions`` and ``/v1/embeddings`` use the same
  pair), its position in the caller's batch, the caller's ``custom_id``, and what its answer is
  checked against.
- :class:`Result`: what came back, in the shape of an OpenAI batch output line: an HTTP-like
  ``status_code`` and ``body``, or an ``error`` when there was no usable answer.

The scheduler, the providers, the jobs and the benchmark see only this pair, so they stay
endpoint-agnostic. ``docs/design.md`` draws the data path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ErrorCode
from ..types import BatchItemError, Endpoint, ToolPromptFormat

__all__ = ["Request", "Result", "failed", "item_error"]


@dataclass(slots=True)
class Request:
    """One request to run.

    ``body`` is the OpenAI request body for ``endpoint`` (``model`` included); ``index`` is the
    item's position in its batch (a job's 0-based line sequence); ``custom_id`` the caller's id.
    The chat-only fields are never sent as such: ``response_schema`` and ``tool_schemas`` are
    what the answer is checked against, ``tool_prompt_format`` asks for tools written into the
    prompt. ``score_span`` marks a scoring request (``/v1/completions`` over token ids, asking
    for the prompt's log-probabilities): the ``(start, end)`` token positions of the prompt
    whose log-probabilities are summed. ``error`` is set when the request was refused before
    dispatch (a malformed message, an empty continuation): it is reported without being
    executed. ``repeat`` numbers identical sampled requests of one call or file (0 for the
    first): the result cache keeps one answer per repeat, so ``k`` samples of one prompt are
    never one answer given ``k`` times. ``prompt_cache_key``: set on a chat request whose
    long prefix other requests of its call or batch share (``prefix.mark_shared_prefixes``);
    providers that route by it send it (``prompt_caching``).
    """

    index: int
    body: dict[str, Any]
    endpoint: Endpoint = Endpoint.chat_completions
    custom_id: str | None = None
    response_schema: dict[str, Any] | None = None
    tool_schemas: dict[str, dict[str, Any]] | None = None
    tool_prompt_format: ToolPromptFormat | None = None
    score_span: tuple[int, int] | None = None
    error: BatchItemError | None = None
    repeat: int = 0
    prompt_cache_key: str | None = None


@dataclass(slots=True)
class Result:
    """The outcome of one :class:`Request` (the fields of an OpenAI batch output line).

    Success: ``status_code`` 200, ``body`` the endpoint's response object (``ChatCompletion``,
    ``Completion``, ...), ``error`` None. API refusal: ``status_code`` 4xx/5xx, ``body``
    ``{"error": {...}}``, ``error`` set. No answer: ``status_code`` and ``body`` None, ``error``
    set. ``ttft_s`` and ``latency_s`` are seconds from dispatch (not from queueing);
    ``attempts`` counts sends including retries. ``extra["cached"]`` is True for an answer
    given by the result cache.
    """

    status_code: int | None
    body: dict[str, Any] | None
    error: BatchItemError | None = None
    request_id: str | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    attempts: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def cached(self) -> bool:
        """Whether the result cache gave this answer (nothing was sent)."""
        return bool(self.extra.get("cached"))


def item_error(
    code: ErrorCode | str,
    message: str,
    *,
    status_code: int | None = None,
    param: str | None = None,
    raw_output: str | None = None,
) -> BatchItemError:
    """A per-item error (``code`` one of :class:`ErrorCode` or an upstream's own)."""
    return BatchItemError(
        code=code.value if isinstance(code, ErrorCode) else code,
        message=message,
        status_code=status_code,
        param=param,
        raw_output=raw_output,
    )


def failed(
    code: ErrorCode, message: str, *, status_code: int | None = None, param: str | None = None
) -> Result:
    """A result for a request that got no usable answer. With a ``status_code`` it is written
    as an API refusal (``body.error{message, type, param, code}``); without one as
    ``error{code, message}``."""
    err = item_error(code, message, status_code=status_code, param=param)
    body = None
    if status_code is not None:
        body = {
            "error": {
                "message": message,
                "type": error_type(code),
                "param": param,
                "code": code.value,
            }
        }
    return Result(status_code=status_code, body=body, error=err)


_ERROR_TYPES = {
    ErrorCode.rate_limited: "rate_limit_error",
    ErrorCode.server_error: "server_error",
    ErrorCode.authentication_error: "authentication_error",
    ErrorCode.permission_denied: "permission_error",
    ErrorCode.model_not_found: "not_found_error",
    ErrorCode.not_found: "not_found_error",
    ErrorCode.engine_error: "server_error",
    ErrorCode.internal_error: "server_error",
    # no usable answer from upstream: the server's side failed, not the request
    ErrorCode.bad_upstream_response: "server_error",
    ErrorCode.response_too_large: "server_error",
    ErrorCode.timeout: "server_error",
    ErrorCode.connection_error: "server_error",
    ErrorCode.endpoint_unavailable: "server_error",
    ErrorCode.output_write_failed: "server_error",
    ErrorCode.storage_error: "server_error",
}


def error_type(code: ErrorCode) -> str:
    """The OpenAI error ``type`` for one of our codes (``invalid_request_error`` by default)."""
    return _ERROR_TYPES.get(code, "invalid_request_error")
