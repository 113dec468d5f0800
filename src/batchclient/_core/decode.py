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
from collections.abc import Sequence
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel

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

LOGPROB_FLOOR = -9999.0
"""The lowest log-probability reported: OpenAI's API gives -9999.0 for a token of probability 0
instead of -inf (JSON has no infinity), and vLLM's OpenAI server does the same
(``max(logprob, -9999.0)`` in ``vllm/entrypoints/openai/serving_chat.py`` and
``serving_completion.py``). :func:`clamp_logprob` applies it."""

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


def clamp_logprob(value: Any) -> float:
    """A log-probability as OpenAI and vLLM report it: a finite number of at least
    :data:`LOGPROB_FLOOR` (-9999.0). ``-inf``, NaN, ``null``, or anything that is not a number
    becomes the floor. The one rule for every provider and endpoint (chat and completions
    answers, the inline engine's mapping, scores)."""
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
                    by_token[alt["token"]] = clamp_logprob(alt.get("logprob"))
            if isinstance(entry.get("token"), str):
                by_token[entry["token"]] = clamp_logprob(entry.get("logprob"))
        out.append(TokenLogProbs(logprobs_by_token=by_token))
    return out


def usage_metrics(usage: Any) -> list[MetricInResponse]:
    """The token counts of an answer's ``usage`` as metrics (unit ``tokens``)."""
    return [MetricInResponse.model_validate(m) for m in _usage_dicts(usage)]


def _usage_dicts(usage: Any) -> list[dict[str, Any]]:
    return _metric_dicts(_usage_metrics(usage))


def _usage_metrics(usage: Any) -> list[Any]:
    """``metric, value, unit`` (flat) for each token count of an answer's ``usage``; every value
    a float, as :func:`number` gives it."""
    metrics: list[Any] = []
    if isinstance(usage, dict):
        for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
            value = usage.get(name)
            # the common case inline (a plain int); anything else goes through number()
            value = (
                float(value) if type(value) is int and -_EXACT < value < _EXACT else number(value)
            )
            if value is not None:
                metrics += (name, value, "tokens")
        details = usage.get("prompt_tokens_details")
        if details is not None:  # prompt tokens read from a prompt cache, where reported
            cached = number(details.get("cached_tokens")) if isinstance(details, dict) else None
            if cached is not None:
                metrics += ("cached_tokens", cached, "tokens")
        details = usage.get("completion_tokens_details")
        if details is not None:  # output tokens spent reasoning, where reported
            spent = number(details.get("reasoning_tokens")) if isinstance(details, dict) else None
            if spent:
                metrics += ("reasoning_tokens", spent, "tokens")
    return metrics


_EXACT = 1 << 53  # ints a float holds exactly (and far from overflowing)


def _metric_dicts(flat: Sequence[Any], start: int = 0) -> list[dict[str, Any]]:
    """The metrics of ``flat[start:]`` (``metric, value, unit`` after one another; a unit of
    None is left unset) as ``MetricInResponse`` fields."""
    return [
        {"metric": flat[i], "value": flat[i + 1]}
        if flat[i + 2] is None
        else {"metric": flat[i], "value": flat[i + 1], "unit": flat[i + 2]}
        for i in range(start, len(flat), 3)
    ]


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
    staged = stage_response(request, result)
    return staged if isinstance(staged, ChatCompletionResponse) else build_response(staged)


StagedResponse = tuple[Any, ...]
"""A checked plain answer not yet built into its ``ChatCompletionResponse``: ``(text,
stop_reason, custom_id, metric, value, unit, metric, value, unit, ...)``. One flat tuple of
atoms, so Python's cycle collector stops tracking it at its first pass over it
(:func:`stage_response` says why that matters)."""


def stage_response(request: Request, result: Result) -> ChatCompletionResponse | StagedResponse:
    """:func:`to_response` in two steps: every check is done here, and the common answer (text
    without tool calls or log-probabilities) comes back as a :data:`StagedResponse` that
    :func:`build_response` turns into the same ``ChatCompletionResponse`` later.

    Why: a batch call keeps every answer until it returns, and each built response is 10-16
    objects the cycle collector tracks; its full collections, which a growing batch
    keeps triggering, rescan all of them, and at 10,000 answers that cost more CPU than the
    HTTP exchanges. Staged answers are untracked tuples; the caller builds them in one go at
    the end (``BatchClient._run``)."""
    if result.error is not None:
        return ChatCompletionResponse(error=result.error, custom_id=request.custom_id)
    try:
        return _success(request, result)
    except Exception as exc:  # a shape no rule above foresaw: this item's error, not the batch's
        return _bad_answer(request, result, f"unreadable answer ({type(exc).__name__})")


def build_response(staged: StagedResponse) -> ChatCompletionResponse:
    """The ``ChatCompletionResponse`` of a :data:`StagedResponse` (every value in it is
    already checked: this cannot fail). Equal to what validating the same fields gives, field
    for field (``==``, ``model_dump``); the difference is in ``model_fields_set``, where every
    field counts as given (:func:`_made` says why)."""
    metrics = [
        _made(MetricInResponse, {"metric": staged[i], "value": float(staged[i + 1]),
                                 "unit": staged[i + 2]})
        for i in range(3, len(staged), 3)
    ]  # fmt: skip
    message = _made(
        CompletionMessage,
        {"role": "assistant", "content": staged[0], "stop_reason": _STOP_REASONS[staged[1]],
         "tool_calls": []},
    )  # fmt: skip
    return _made(
        ChatCompletionResponse,
        {"completion_message": message, "logprobs": None, "metrics": metrics, "error": None,
         "custom_id": staged[2]},
    )  # fmt: skip


_STOP_REASONS = {reason.value: reason for reason in StopReason}
_STOP_VALUES = {reason: reason.value for reason in StopReason}  # plain str: staged as an atom
_M = TypeVar("_M", bound=BaseModel)
_new = object.__new__
_set_dict = object.__setattr__
# the setters of BaseModel's slots (pydantic.main.BaseModel.__slots__)
_set_fields_set = vars(BaseModel)["__pydantic_fields_set__"].__set__
_set_extra = vars(BaseModel)["__pydantic_extra__"].__set__
_set_private = vars(BaseModel)["__pydantic_private__"].__set__
# one set of every field name per model, shared by all the instances _made builds: assigning a
# field adds its name to the set, which it already holds, so the shared set never changes
_EVERY_FIELD: dict[type[BaseModel], set[str]] = {
    model: set(model.model_fields) for model in (ChatCompletionResponse, CompletionMessage,
                                                  MetricInResponse)
}  # fmt: skip


def _made(model: type[_M], values: dict[str, Any]) -> _M:
    """An instance of ``model`` holding ``values`` (every field, in field order, each already
    of its field's type), set up as pydantic sets up a validated one.

    Why not pydantic-core: a batch call keeps every answer until it returns, and Python's cycle
    collector rescans them in each full collection that a growing batch keeps triggering. A
    validated instance brings three tracked objects (itself, its ``__dict__``, its set of given
    fields); here the set is shared (:data:`_EVERY_FIELD`) and a ``__dict__`` of plain values
    (a metric's) is not tracked at all: an answer is 10 tracked objects instead of 16, and
    building 10,000 of them takes 12 us each instead of 30 with the collector on
    (4.4 against 6.8 with it off)."""
    instance = _new(model)
    _set_dict(instance, "__dict__", values)
    _set_fields_set(instance, _EVERY_FIELD[model])
    _set_extra(instance, None)
    _set_private(instance, None)
    return instance


def _bad_answer(request: Request, result: Result, why: str) -> ChatCompletionResponse:
    return ChatCompletionResponse(
        error=item_error(
            ErrorCode.bad_upstream_response,
            f"{why}: {excerpt(result.body)}",
            status_code=result.status_code,
        ),
        custom_id=request.custom_id,
    )


def _success(request: Request, result: Result) -> ChatCompletionResponse | StagedResponse:
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

    metrics = _usage_metrics(body.get("usage"))
    if result.ttft_s is not None:
        metrics += ("time_to_first_token", result.ttft_s, "s")
    if result.latency_s is not None:
        metrics += ("latency", result.latency_s, "s")
    if result.cached:
        metrics += ("cached", 1, None)
    logprobs = None if choice.get("logprobs") is None else parse_logprobs(choice)
    if not tool_calls and logprobs is None:
        return (text, _STOP_VALUES[stop_reason], custom_id, *metrics)
    # one validation of the whole response (nested models built in pydantic-core) costs about
    # a third less than building each model on its own
    return ChatCompletionResponse.model_validate(
        {
            "completion_message": {
                "content": text,
                "stop_reason": stop_reason,
                "tool_calls": tool_calls,
            },
            "logprobs": logprobs,
            "metrics": _metric_dicts(metrics),
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
    """A non-2xx HTTP answer as a result: the upstream error body is kept as is when it is a
    JSON object (OpenAI batch output: ``response.status_code`` + ``body``), else an OpenAI
    error envelope around its text; the item gets one of our codes."""
    text = bytes(raw).decode("utf-8", "replace") if isinstance(raw, bytes | bytearray) else raw
    text = text or ""
    upstream: dict[str, Any] = {}
    parsed = None
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
    body = parsed if isinstance(parsed, dict) else {
        "error": {
            "message": message,
            "type": upstream_type if isinstance(upstream_type, str) else error_type(code),
            "param": param,
            "code": upstream_code if isinstance(upstream_code, str | int) else code.value,
        }
    }  # fmt: skip
    return Result(
        status_code=status,
        body=body,
        error=item_error(code, message, status_code=status, param=param),
    )


def classify_http(status: int, message: str) -> ErrorCode:
    if status in (429, 498):  # 498: Groq's capacity_exceeded (its flex tier is full)
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
