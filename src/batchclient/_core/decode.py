"""Results -> the protocol's responses, and HTTP error answers -> results.

:func:`to_response` turns any :class:`Result` of a chat request into a
``ChatCompletionResponse`` in one place (finish-reason mapping, usage metrics, tool-call and
schema checks), so ``batch_chat_completion``, jobs and every provider give the same verdict per
item. :func:`http_error` keeps an upstream's error body and classifies it into an
:class:`~batchclient.ErrorCode`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ..errors import ErrorCode
from ..types import (
    ChatCompletionResponse,
    CompletionMessage,
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


def _finite(value: Any) -> float:
    v = float(value)
    return v if math.isfinite(v) and v > LOGPROB_FLOOR else LOGPROB_FLOOR


def parse_logprobs(choice: dict[str, Any]) -> list[TokenLogProbs] | None:
    lp = choice.get("logprobs")
    if not lp or not isinstance(lp, dict) or lp.get("content") is None:
        return None
    out: list[TokenLogProbs] = []
    for entry in lp["content"]:
        by_token: dict[str, float] = {}
        for alt in entry.get("top_logprobs") or ():
            by_token[alt["token"]] = _finite(alt["logprob"])
        by_token[entry["token"]] = _finite(entry["logprob"])
        out.append(TokenLogProbs(logprobs_by_token=by_token))
    return out


def usage_metrics(usage: dict[str, Any] | None) -> list[MetricInResponse]:
    metrics: list[MetricInResponse] = []
    if usage:
        for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
            value = usage.get(name)
            if isinstance(value, int | float):
                metrics.append(MetricInResponse(metric=name, value=value, unit="tokens"))
    return metrics


def to_response(request: Request, result: Result) -> ChatCompletionResponse:
    """The protocol's ``ChatCompletionResponse`` for one result. Never raises: a body that is
    not a usable ChatCompletion becomes ``bad_upstream_response``; tool-call arguments that are
    not an object or do not match the tool's schema become ``invalid_tool_call``; a constrained
    answer that does not match its schema becomes ``invalid_structured_output``."""
    custom_id = request.custom_id
    if result.error is not None:
        return ChatCompletionResponse(error=result.error, custom_id=custom_id)
    body = result.body or {}
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ChatCompletionResponse(
            error=item_error(
                ErrorCode.bad_upstream_response,
                f"answer without choices: {json.dumps(body)[:300]}",
                status_code=result.status_code,
            ),
            custom_id=custom_id,
        )
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        return ChatCompletionResponse(
            error=item_error(
                ErrorCode.bad_upstream_response,
                "choice without a message",
                status_code=result.status_code,
            ),
            custom_id=custom_id,
        )
    text = message.get("content") or ""
    finish = choice.get("finish_reason") or "stop"
    stop_reason = FINISH_REASONS.get(finish, StopReason.end_of_turn)

    tool_calls, problem = check_answer(request, message, text, finish)
    if problem is not None:
        return ChatCompletionResponse(error=problem, custom_id=custom_id)
    if tool_calls:
        stop_reason = StopReason.end_of_message

    metrics = usage_metrics(body.get("usage"))
    if result.ttft_s is not None:
        metrics.append(
            MetricInResponse(metric="time_to_first_token", value=result.ttft_s, unit="s")
        )
    if result.latency_s is not None:
        metrics.append(MetricInResponse(metric="latency", value=result.latency_s, unit="s"))
    if result.cached:
        metrics.append(MetricInResponse(metric="cached", value=1))
    return ChatCompletionResponse(
        completion_message=CompletionMessage(
            content=text, stop_reason=stop_reason, tool_calls=tool_calls
        ),
        logprobs=parse_logprobs(choice),
        metrics=metrics,
        custom_id=custom_id,
    )


# ---------------------------------------------------------------------------- HTTP errors

_CONTEXT_RE = re.compile(
    r"maximum context length|context length|context window|too long|max_model_len|"
    r"maximum model length|exceeds? the (model's )?max",
    re.IGNORECASE,
)


def http_error(status: int, raw: bytes | str | None) -> Result:
    """A non-2xx HTTP answer as a result: the upstream error body is kept (OpenAI batch output:
    ``response.status_code`` + ``body.error``) and the item gets one of our codes."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else (raw or "")
    upstream: dict[str, Any] = {}
    try:
        parsed = json.loads(text) if text else None
        if isinstance(parsed, dict):
            err = parsed.get("error", parsed)
            upstream = err if isinstance(err, dict) else {"message": str(err)}
    except ValueError:
        pass
    message = str(
        upstream.get("message") or upstream.get("detail") or text[:500] or f"HTTP {status}"
    )
    param = upstream.get("param") if isinstance(upstream.get("param"), str) else None
    code = classify_http(status, message)
    body = {
        "error": {
            "message": message,
            "type": upstream.get("type") or error_type(code),
            "param": param,
            "code": upstream.get("code") if upstream.get("code") is not None else code.value,
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
