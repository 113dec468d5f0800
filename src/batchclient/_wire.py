"""Protocol types <-> the OpenAI chat-completions wire format, and the internal request/result.

Every provider speaks the same internal pair:

- :class:`ChatRequest`: one conversation as an OpenAI ``/v1/chat/completions`` body (``model``
  included), its position in the caller's batch, the caller's ``custom_id``, and what its answer
  will be checked against (JSON schema, tool schemas).
- :class:`ChatResult`: what came back, in the shape of an OpenAI batch output line: an HTTP-like
  ``status_code`` and ``body`` (a ``ChatCompletion`` object on success, ``{"error": {...}}`` on
  an API refusal), or an ``error`` when there was no answer at all (timeout, dropped connection).

The remote provider sends the body as it is; the inline provider maps it to vLLM (like vLLM's own
OpenAI server does); jobs read bodies straight from OpenAI batch JSONL and write results back in
the same shape. :func:`to_response` turns a result into the protocol's ``ChatCompletionResponse``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ErrorCode
from .types import (
    BatchItemError,
    ChatCompletionResponse,
    CompletionMessage,
    GrammarResponseFormat,
    GreedySamplingStrategy,
    ImageContentItem,
    InterleavedContent,
    JsonSchemaResponseFormat,
    LogProbConfig,
    Message,
    MetricInResponse,
    ResponseFormat,
    SamplingParams,
    StopReason,
    SystemMessage,
    TextContentItem,
    TokenLogProbs,
    ToolChoice,
    ToolDefinition,
    ToolParamDefinition,
    ToolPromptFormat,
    ToolResponseMessage,
    TopKSamplingStrategy,
    TopPSamplingStrategy,
    UserMessage,
)

# OpenAI clamps log-probabilities of impossible tokens to this floor instead of -inf.
LOGPROB_FLOOR = -9999.0

FINISH_REASONS: dict[str, StopReason] = {
    "stop": StopReason.end_of_turn,
    "length": StopReason.out_of_tokens,
    "tool_calls": StopReason.end_of_message,
    "function_call": StopReason.end_of_message,
    "abort": StopReason.out_of_tokens,
}


@dataclass(slots=True)
class ChatRequest:
    """One conversation to run. ``body`` is an OpenAI chat-completions request body."""

    index: int
    body: dict[str, Any]
    custom_id: str | None = None
    # Checked against the answer, never sent as such.
    response_schema: dict[str, Any] | None = None
    tool_schemas: dict[str, dict[str, Any]] | None = None
    tool_prompt_format: ToolPromptFormat | None = None
    # Set when the request was refused before dispatch (e.g. a malformed message).
    error: BatchItemError | None = None


@dataclass(slots=True)
class ChatResult:
    """The outcome of one :class:`ChatRequest` (the fields of an OpenAI batch output line).

    Success: ``status_code`` 200, ``body`` a ChatCompletion object, ``error`` None.
    API refusal: ``status_code`` 4xx/5xx, ``body`` ``{"error": {...}}``, ``error`` set.
    No answer: ``status_code`` and ``body`` None, ``error`` set.
    Times are seconds from dispatch (not from queueing).
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


def item_error(
    code: ErrorCode | str,
    message: str,
    *,
    status_code: int | None = None,
    param: str | None = None,
    raw_output: str | None = None,
) -> BatchItemError:
    return BatchItemError(
        code=code.value if isinstance(code, ErrorCode) else code,
        message=message,
        status_code=status_code,
        param=param,
        raw_output=raw_output,
    )


def failed(
    code: ErrorCode, message: str, *, status_code: int | None = None, param: str | None = None
) -> ChatResult:
    """A result for a request that got no usable answer. With a ``status_code`` it is written
    as an API refusal (``body.error``); without one as ``error{code, message}``."""
    err = item_error(code, message, status_code=status_code, param=param)
    body = None
    if status_code is not None:
        body = {
            "error": {
                "message": message,
                "type": _ERROR_TYPES.get(code, "invalid_request_error"),
                "param": param,
                "code": code.value,
            }
        }
    return ChatResult(status_code=status_code, body=body, error=err)


_ERROR_TYPES = {
    ErrorCode.rate_limited: "rate_limit_error",
    ErrorCode.server_error: "server_error",
    ErrorCode.authentication_error: "authentication_error",
    ErrorCode.permission_denied: "permission_error",
    ErrorCode.model_not_found: "not_found_error",
    ErrorCode.not_found: "not_found_error",
    ErrorCode.engine_error: "server_error",
    ErrorCode.internal_error: "server_error",
}


# ---------------------------------------------------------------------------- request side


def content_to_wire(content: InterleavedContent) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    items = content if isinstance(content, list) else [content]
    if all(isinstance(i, TextContentItem) for i in items):
        return "".join(i.text for i in items if isinstance(i, TextContentItem))
    parts: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, TextContentItem):
            parts.append({"type": "text", "text": item.text})
        elif isinstance(item, ImageContentItem):
            parts.append({"type": "image_url", "image_url": {"url": item.url}})
    return parts


def message_to_wire(message: Message) -> dict[str, Any]:
    if isinstance(message, UserMessage):
        content = content_to_wire(message.content)
        if message.context is not None:
            ctx = content_to_wire(message.context)
            if isinstance(content, str) and isinstance(ctx, str):
                content = f"{content}\n\n{ctx}"
        return {"role": "user", "content": content}
    if isinstance(message, SystemMessage):
        return {"role": "system", "content": content_to_wire(message.content)}
    if isinstance(message, ToolResponseMessage):
        return {
            "role": "tool",
            "tool_call_id": message.call_id,
            "content": content_to_wire(message.content),
        }
    out: dict[str, Any] = {"role": "assistant", "content": content_to_wire(message.content)}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.tool_name, "arguments": json.dumps(call.arguments)},
            }
            for call in message.tool_calls
        ]
        if out["content"] == "":
            out["content"] = None
    return out


def sampling_to_wire(params: SamplingParams) -> dict[str, Any]:
    """greedy -> temperature 0; top_p -> temperature + top_p; top_k -> temperature + ``top_k``
    (an extra field vLLM servers accept); ``repetition_penalty`` and ``ignore_eos`` likewise
    (sent only when not the default); ``max_tokens`` 0 ->
    omitted (the server's default, up to the context)."""
    out: dict[str, Any] = {}
    strategy = params.strategy
    if isinstance(strategy, GreedySamplingStrategy):
        out["temperature"] = 0.0
    elif isinstance(strategy, TopPSamplingStrategy):
        out["temperature"] = strategy.temperature
        out["top_p"] = strategy.top_p
    elif isinstance(strategy, TopKSamplingStrategy):
        out["temperature"] = strategy.temperature
        out["top_k"] = strategy.top_k
    if params.max_tokens:
        out["max_tokens"] = params.max_tokens
    if params.repetition_penalty != 1.0:
        out["repetition_penalty"] = params.repetition_penalty
    if params.stop:
        out["stop"] = list(params.stop)
    if params.ignore_eos:
        out["ignore_eos"] = True
    return out


_PARAM_TYPES = {
    "str": "string",
    "string": "string",
    "int": "integer",
    "integer": "integer",
    "float": "number",
    "number": "number",
    "bool": "boolean",
    "boolean": "boolean",
    "list": "array",
    "array": "array",
    "dict": "object",
    "object": "object",
}


def _param_schema(param: ToolParamDefinition) -> dict[str, Any]:
    base = param.param_type.split("[", 1)[0].strip().lower()
    schema: dict[str, Any] = {}
    if base in _PARAM_TYPES:
        schema["type"] = _PARAM_TYPES[base]
    if param.description:
        schema["description"] = param.description
    if param.default is not None:
        schema["default"] = param.default
    return schema


def tool_parameters_schema(tool: ToolDefinition) -> dict[str, Any]:
    """The JSON schema of a tool's arguments, built from its ``ToolParamDefinition`` entries."""
    params = tool.parameters or {}
    return {
        "type": "object",
        "properties": {name: _param_schema(p) for name, p in params.items()},
        "required": [name for name, p in params.items() if p.required],
    }


def tool_to_wire(tool: ToolDefinition | dict[str, Any]) -> dict[str, Any]:
    """A tool as an OpenAI ``tools[]`` entry. OpenAI-form dicts pass through unchanged.

    A ``ToolDefinition`` whose parameters are all required is sent with ``"strict": true`` and
    ``"additionalProperties": false`` (OpenAI's strict function calling, whose rules it then
    meets): vLLM's server only constrains a forced call's arguments to the schema for strict
    tools (vLLM 0.32, ``tool_parsers/structural_tag_registry.py``); without it the bundled
    model's named call came back with the arguments ``"Paris"`` (GUIDE.md). A tool with
    optional parameters cannot be strict (OpenAI refuses it), so its arguments are only
    checked after the fact (``invalid_tool_call``).
    """
    if isinstance(tool, dict):
        if tool.get("type") == "function" and "function" in tool:
            return tool
        tool = ToolDefinition.model_validate(tool)
    parameters = tool_parameters_schema(tool)
    function: dict[str, Any] = {"name": tool.tool_name, "parameters": parameters}
    if tool.description:
        function["description"] = tool.description
    if all(p.required for p in (tool.parameters or {}).values()):
        parameters["additionalProperties"] = False
        function["strict"] = True
    return {"type": "function", "function": function}


def tool_choice_to_wire(choice: ToolChoice | str) -> str | dict[str, Any]:
    value = choice.value if isinstance(choice, ToolChoice) else choice
    if value in ("auto", "required", "none"):
        return value
    return {"type": "function", "function": {"name": value}}


def response_format_to_wire(fmt: ResponseFormat) -> dict[str, Any]:
    """json_schema -> OpenAI ``response_format``; grammar -> vLLM's ``structured_outputs``
    request field (an OpenAI endpoint that is not vLLM ignores or refuses it)."""
    if isinstance(fmt, JsonSchemaResponseFormat):
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": fmt.json_schema},
            }
        }
    assert isinstance(fmt, GrammarResponseFormat)
    grammar = fmt.bnf.get("grammar") if isinstance(fmt.bnf, dict) else None
    if not isinstance(grammar, str):
        grammar = json.dumps(fmt.bnf)
    return {"structured_outputs": {"grammar": grammar}}


def logprobs_to_wire(config: LogProbConfig) -> dict[str, Any]:
    return {"logprobs": True, "top_logprobs": config.top_k}


def build_body(
    model: str,
    messages: Sequence[Message],
    sampling_params: SamplingParams,
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    tool_choice: ToolChoice | str = ToolChoice.auto,
    response_format: ResponseFormat | None = None,
    logprobs: LogProbConfig | None = None,
) -> dict[str, Any]:
    """The OpenAI chat-completions body for one conversation (``tools`` already in wire form)."""
    body: dict[str, Any] = {"model": model, "messages": [message_to_wire(m) for m in messages]}
    body.update(sampling_to_wire(sampling_params))
    if tools:
        body["tools"] = list(tools)
        body["tool_choice"] = tool_choice_to_wire(tool_choice)
    if response_format is not None:
        body.update(response_format_to_wire(response_format))
    if logprobs is not None:
        body.update(logprobs_to_wire(logprobs))
    return body


# ---------------------------------------------------------------------------- response side


def parse_arguments(raw: Any) -> dict[str, Any]:
    """Tool-call arguments as a dict. OpenAI sends a JSON string; anything that is not a JSON
    object raises ``ValueError`` (the caller turns it into ``invalid_tool_call``)."""
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    value = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(value, dict):
        raise ValueError(f"tool-call arguments are not a JSON object: {raw!r}")
    return value


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


def to_response(request: ChatRequest, result: ChatResult) -> ChatCompletionResponse:
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

    from ._checks import check_answer  # local: keeps jsonschema off the import path of _wire

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


def http_error(status: int, raw: bytes | str | None) -> ChatResult:
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
            "type": upstream.get("type") or _ERROR_TYPES.get(code, "invalid_request_error"),
            "param": param,
            "code": upstream.get("code") if upstream.get("code") is not None else code.value,
        }
    }
    return ChatResult(
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
