"""Results -> the protocol's responses, server bytes -> JSON, and HTTP error answers -> results.

:func:`to_response` turns any :class:`Result` of a chat request into a
``ChatCompletionResponse`` in one place (finish-reason mapping, usage metrics, tool-call and
schema checks), so ``batch_chat_completion``, jobs and every provider give the same verdict per
item. :func:`http_error` keeps an upstream's error body and classifies it into an
:class:`~batchclient.ErrorCode`. :func:`load_json` parses what a server sent.

Nothing a server sends raises out of these: a value of the wrong type, a missing field, a
``null``, ``NaN`` or ``Infinity`` where a number belongs is read as absent (log-probabilities:
clamped to -9999.0 as OpenAI clamps them), and anything still unreadable is that item's
``bad_upstream_response`` with an excerpt.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

from ..errors import ErrorCode
from ..types import (
    ChatCompletionResponse,
    MetricInResponse,
    StopReason,
    TokenLogProbs,
)
from .checks import check_answer
from .request import Request, Result, error_type, item_error

# OpenAI clamps log-probabilities of impossible tokens to this floor instead of -inf.
LOGPROB_FLOOR = -9999.0

FINISH_REASONS: dict[str, StopReason] = {
    "stop": StopReason.end_of_turn,
    "length": StopReason.out_of_tokens,
    "tool_calls": StopReason.end_of_message,
    "function_call": StopReason.end_of_message,
    "abort": StopReason.out_of_tokens,
}


_INT_RANGE = (-(1 << 63), (1 << 64) - 1)  # what orjson (and SQLite's JSON) can write back


def load_json(raw: bytes | bytearray | str) -> Any:
    """A server's JSON. orjson first; when it refuses, Python's parser, which also reads
    ``NaN``, ``Infinity``, ``-Infinity`` and numbers that overflow a double (as Python's own
    ``json.dumps`` and some C++ libraries write them); such values are then replaced by
    :func:`clean_numbers`, so what is kept is strict JSON again.

    Raises:
        ValueError: not JSON even so (including nesting too deep to parse).
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return clean_numbers(json.loads(raw))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def clean_numbers(value: Any) -> Any:
    """``value`` with every non-finite float replaced: by -9999.0 under a ``logprob`` key (as
    OpenAI clamps), by None elsewhere; integers outside 64 bits become floats (None when
    infinite). Iterative, so no nesting depth can overflow the stack."""
    root = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        container, key = stack.pop()
        item = container[key]
        if isinstance(item, dict):
            stack.extend((item, k) for k in item)
        elif isinstance(item, list):
            stack.extend((item, i) for i in range(len(item)))
        elif isinstance(item, float):
            if not math.isfinite(item):
                container[key] = LOGPROB_FLOOR if key == "logprob" else None
        elif (
            isinstance(item, int)
            and not isinstance(item, bool)
            and not _INT_RANGE[0] <= item <= _INT_RANGE[1]
        ):
            try:
                container[key] = float(item)
            except OverflowError:
                container[key] = None
    return root[0]


def number(value: Any) -> float | None:
    """A finite number, or None for anything else (``null``, a string, a bool, NaN, inf)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        v = float(value)
    except OverflowError:
        return None
    return v if math.isfinite(v) else None


def _logprob(value: Any) -> float:
    v = number(value)
    return v if v is not None and v > LOGPROB_FLOOR else LOGPROB_FLOOR


def parse_logprobs(choice: dict[str, Any]) -> list[TokenLogProbs] | None:
    """``choice.logprobs.content`` as one ``{token: logprob}`` per generated token; a missing,
    null or non-finite log-probability is the floor (-9999.0); malformed entries are empty."""
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if not isinstance(content, list):
        return None
    out: list[TokenLogProbs] = []
    for entry in content:
        by_token: dict[str, float] = {}
        if isinstance(entry, dict):
            top = entry.get("top_logprobs")
            for alt in top if isinstance(top, list) else ():
                if isinstance(alt, dict) and isinstance(alt.get("token"), str):
                    by_token[alt["token"]] = _logprob(alt.get("logprob"))
            if isinstance(entry.get("token"), str):
                by_token[entry["token"]] = _logprob(entry.get("logprob"))
        out.append(TokenLogProbs(logprobs_by_token=by_token))
    return out


def usage_metrics(usage: Any) -> list[MetricInResponse]:
    """The token counts of an answer's ``usage`` as metrics (unit ``tokens``)."""
    return [MetricInResponse.model_validate(m) for m in _usage_dicts(usage)]


def _usage_dicts(usage: Any) -> list[dict[str, Any]]:
    metrics: list[dict[str, Any]] = []
    if isinstance(usage, dict):
        for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
            value = number(usage.get(name))
            if value is not None:
                metrics.append({"metric": name, "value": value, "unit": "tokens"})
    return metrics


def _text(content: Any) -> str | None:
    """A message's text: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)  # type: ignore[arg-type]
    return None


def excerpt(body: Any, limit: int = 300) -> str:
    """The start of a body for an error message."""
    try:
        text = json.dumps(body, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        text = repr(body)
    return text[:limit]


def to_response(request: Request, result: Result) -> ChatCompletionResponse:
    """The protocol's ``ChatCompletionResponse`` for one result. Never raises: a body that is
    not a usable ChatCompletion becomes ``bad_upstream_response``; tool-call arguments that are
    not an object or do not match the tool's schema become ``invalid_tool_call``; a constrained
    answer that does not match its schema becomes ``invalid_structured_output``."""
    if result.error is not None:
        return ChatCompletionResponse(error=result.error, custom_id=request.custom_id)
    try:
        return _success(request, result)
    except Exception as exc:  # a shape no rule above foresaw: this item's error, not the batch's
        return _bad_answer(request, result, f"unreadable answer ({type(exc).__name__})")


def _bad_answer(request: Request, result: Result, why: str) -> ChatCompletionResponse:
    return ChatCompletionResponse(
        error=item_error(
            ErrorCode.bad_upstream_response,
            f"{why}: {excerpt(result.body)}",
            status_code=result.status_code,
        ),
        custom_id=request.custom_id,
    )


def _success(request: Request, result: Result) -> ChatCompletionResponse:
    custom_id = request.custom_id
    body = result.body if isinstance(result.body, dict) else {}
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return _bad_answer(request, result, "answer without choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        return _bad_answer(request, result, "choice without a message")
    text = _text(message.get("content"))
    if text is None:
        return _bad_answer(request, result, "message content is not text")
    finish = choice.get("finish_reason")
    finish = finish if isinstance(finish, str) and finish else "stop"
    stop_reason = FINISH_REASONS.get(finish, StopReason.end_of_turn)

    tool_calls, problem = check_answer(request, message, text, finish)
    if problem is not None:
        return ChatCompletionResponse(error=problem, custom_id=custom_id)
    if tool_calls:
        stop_reason = StopReason.end_of_message

    metrics = _usage_dicts(body.get("usage"))
    if result.ttft_s is not None:
        metrics.append({"metric": "time_to_first_token", "value": result.ttft_s, "unit": "s"})
    if result.latency_s is not None:
        metrics.append({"metric": "latency", "value": result.latency_s, "unit": "s"})
    if result.cached:
        metrics.append({"metric": "cached", "value": 1})
    # one validation of the whole response (nested models built in pydantic-core) costs about
    # a third less than building each model on its own
    return ChatCompletionResponse.model_validate(
        {
            "completion_message": {
                "content": text,
                "stop_reason": stop_reason,
                "tool_calls": tool_calls,
            },
            "logprobs": parse_logprobs(choice),
            "metrics": metrics,
            "custom_id": custom_id,
        }
    )


# ---------------------------------------------------------------------------- HTTP errors

_CONTEXT_RE = re.compile(
    r"maximum context length|context length|context window|too long|max_model_len|"
    r"maximum model length|exceeds? the (model's )?max",
    re.IGNORECASE,
)


def http_error(status: int, raw: bytes | bytearray | str | None) -> Result:
    """A non-2xx HTTP answer as a result: the upstream error body is kept (OpenAI batch output:
    ``response.status_code`` + ``body.error``) and the item gets one of our codes."""
    text = bytes(raw).decode("utf-8", "replace") if isinstance(raw, bytes | bytearray) else raw
    text = text or ""
    upstream: dict[str, Any] = {}
    try:
        parsed = load_json(text) if text else None
        if isinstance(parsed, dict):
            err = parsed.get("error", parsed)
            upstream = err if isinstance(err, dict) else {"message": str(err)}
    except ValueError:
        pass
    message = upstream.get("message") or upstream.get("detail") or text[:500] or f"HTTP {status}"
    message = message if isinstance(message, str) else excerpt(message, 500)
    param = upstream.get("param") if isinstance(upstream.get("param"), str) else None
    code = classify_http(status, message)
    upstream_type = upstream.get("type")
    upstream_code = upstream.get("code")
    body = {
        "error": {
            "message": message,
            "type": upstream_type if isinstance(upstream_type, str) else error_type(code),
            "param": param,
            "code": upstream_code if isinstance(upstream_code, str | int) else code.value,
        }
    }
    return Result(
        status_code=status,
        body=body,
        error=item_error(code, message, status_code=status, param=param),
    )


def classify_http(status: int, message: str) -> ErrorCode:
    if status == 429:
        return ErrorCode.rate_limited
    if status == 401:
        return ErrorCode.authentication_error
    if status == 403:
        return ErrorCode.permission_denied
    if status == 404:
        return ErrorCode.model_not_found if "model" in message.lower() else ErrorCode.not_found
    if status in (400, 413, 422):
        if _CONTEXT_RE.search(message):
            return ErrorCode.context_length_exceeded
        return ErrorCode.invalid_request
    if status >= 500:
        return ErrorCode.server_error
    return ErrorCode.http_error
