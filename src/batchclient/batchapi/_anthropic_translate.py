"""OpenAI chat bodies to Anthropic Messages requests, and Anthropic answers back to OpenAI
``chat.completion`` bodies (Anthropic API reference: Messages, Message Batches).

What is kept, and what is refused per item (``unsupported_parameter``, ``param`` naming the
field; nothing is dropped silently, and a field at its neutral value, ``n: 1``, zero penalties,
..., is accepted and not sent): ``docs/batch-api.md``, "Anthropic Message Batches".
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from .._core.request import Result, failed
from ..errors import ErrorCode

VERSION_WITH_SAMPLING = "2023-06-01"
"""The ``anthropic-version`` this client sends by default: it accepts ``temperature``,
``top_p`` and ``top_k`` (every batchclient call sends ``temperature``: greedy is 0)."""
_SAMPLING_VERSIONS = frozenset({"2023-01-01", VERSION_WITH_SAMPLING})
SAMPLING = ("temperature", "top_p", "top_k")
_INVALID = ErrorCode.invalid_request

# neutral values: a field holding one asks for nothing Anthropic would do differently
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "stream": (None, False),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "seed": (None,),
    "logit_bias": (None, {}),
    "store": (None, False),
    "metadata": (None, {}),
    "service_tier": (None,),
    "stream_options": (None,),
    "repetition_penalty": (None, 1, 1.0),
}
_KEPT = frozenset(
    {
        "model", "messages", "max_tokens", "max_completion_tokens", "stop", "tools",
        "tool_choice", "parallel_tool_calls", "response_format", "user", *SAMPLING,
    }
)  # fmt: skip
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


class Refused(Exception):
    """A body Anthropic cannot take as given: ``code``, ``message``, ``param``."""

    def __init__(self, message: str, param: str | None = None, code: ErrorCode | None = None):
        super().__init__(message)
        self.param = param
        self.code = code or ErrorCode.unsupported_parameter


def to_params(
    body: dict[str, Any], *, max_tokens: int, api_version: str = VERSION_WITH_SAMPLING
) -> dict[str, Any] | Result:
    """The Messages request for an OpenAI chat ``body`` sent under ``anthropic-version``
    ``api_version``, or a failed :class:`Result` (``unsupported_parameter`` /
    ``invalid_request``) saying what cannot be sent."""
    try:
        return _params(body, max_tokens, api_version)
    except Refused as refusal:
        return failed(refusal.code, str(refusal), status_code=400, param=refusal.param)


def _params(body: dict[str, Any], default_max: int, version: str) -> dict[str, Any]:
    for key, value in body.items():
        if key in _KEPT:
            continue
        if key in _NEUTRAL and value in _NEUTRAL[key]:
            continue
        raise Refused(f"Anthropic Message Batches cannot honour {key}={value!r}", key)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise Refused("model is required", "model", _INVALID)
    system, messages = _messages(body.get("messages"))
    out: dict[str, Any] = {"model": model}
    limit = body.get("max_completion_tokens") or body.get("max_tokens") or default_max
    if not isinstance(limit, int) or limit < 1:
        raise Refused(
            "max_tokens must be a positive integer", "max_tokens", ErrorCode.invalid_request
        )
    out["max_tokens"] = limit
    if system:
        out["system"] = system
    out["messages"] = messages
    stop = body.get("stop")
    if stop is not None:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    for key in SAMPLING:
        if body.get(key) is None:
            continue
        if version not in _SAMPLING_VERSIONS:
            raise Refused(
                f"{key} cannot be sent under anthropic-version {version} (it has no sampling "
                f"fields); use api_version={VERSION_WITH_SAMPLING!r} to send it",
                key,
            )
        out[key] = body[key]
    _tools(body, out)
    _response_format(body.get("response_format"), out)
    if body.get("user") is not None:
        out["metadata"] = {"user_id": str(body["user"])}
    return out


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" for p in content
    ):
        return "".join(str(p.get("text", "")) for p in content)
    raise Refused(f"{where} content must be text", "messages")


def _blocks(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise Refused("message content must be a string or a list of parts", "messages")
    out: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            block = {"type": "text", "text": str(part.get("text", ""))}
        elif kind == "image_url":
            block = _image(part.get("image_url"))
        else:
            raise Refused(
                f"a content part of type {kind!r} cannot be sent to Anthropic", "messages"
            )
        _keep_mark(part, block)
        out.append(block)
    return out


def _keep_mark(part: dict[str, Any], block: dict[str, Any]) -> None:
    """A content part's own ``cache_control`` (Anthropic's prompt-cache breakpoint, which
    OpenAI-shaped gateways pass on the same way) is kept on its block, as sent."""
    mark = part.get("cache_control")
    if mark is not None:
        if not isinstance(mark, dict):
            raise Refused("cache_control must be an object", "messages")
        block["cache_control"] = mark


def _image(spec: Any) -> dict[str, Any]:
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str):
        raise Refused("image_url needs a url", "messages")
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        media = head[5:].split(";")[0]
        if ";base64" not in head or not media:
            raise Refused("an image data URL must be base64", "messages")
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _messages(raw: Any) -> tuple[str | list[dict[str, Any]], list[dict[str, Any]]]:
    """The system prompt (a string; text blocks when a part of it carries its own
    ``cache_control``) and the messages."""
    if not isinstance(raw, list) or not raw:
        raise Refused("messages must be a non-empty list", "messages", _INVALID)
    system: list[str] = []
    system_blocks: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for message in raw:
        if not isinstance(message, dict):
            raise Refused("each message must be an object", "messages", _INVALID)
        role = message.get("role")
        if message.get("name"):
            raise Refused("message names cannot be sent to Anthropic", "messages")
        if role in ("system", "developer"):
            if out:
                raise Refused(
                    "a system message after the conversation started cannot be sent to "
                    "Anthropic (its system prompt is top-level)",
                    "messages",
                )
            content = message.get("content")
            system.append(_text(content, "a system message's"))
            system_blocks += _blocks(content)
        elif role == "user":
            out.append({"role": "user", "content": _blocks(message.get("content"))})
        elif role == "assistant":
            blocks = _blocks(message.get("content"))
            for call in message.get("tool_calls") or []:
                blocks.append(_tool_use(call))
            out.append({"role": "assistant", "content": blocks})
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": str(message.get("tool_call_id") or ""),
                "content": _text(message.get("content"), "a tool message's"),
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "user" and _all_results(last["content"]):
                last["content"].append(result)  # one user turn carries every parallel result
            else:
                out.append({"role": "user", "content": [result]})
        else:
            raise Refused(f"unknown message role {role!r}", "messages", _INVALID)
    if any("cache_control" in block for block in system_blocks):
        return system_blocks, out
    return "\n\n".join(system), out


def _all_results(blocks: list[dict[str, Any]]) -> bool:
    return bool(blocks) and all(b.get("type") == "tool_result" for b in blocks)


def _tool_use(call: Any) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise Refused("a tool call needs a function name", "messages", _INVALID)
    try:
        args = orjson.loads(fn.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        raise Refused(
            "tool call arguments must be JSON", "messages", ErrorCode.invalid_request
        ) from None
    return {"type": "tool_use", "id": str(call.get("id") or ""), "name": fn["name"], "input": args}


def _tools(body: dict[str, Any], out: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools:
        converted = []
        for tool in tools:
            fn = tool.get("function") if isinstance(tool, dict) else None
            if (
                not isinstance(tool, dict)
                or tool.get("type") != "function"
                or not isinstance(fn, dict)
            ):
                raise Refused("only function tools can be sent to Anthropic", "tools")
            spec: dict[str, Any] = {
                "name": fn.get("name"),
                "input_schema": fn.get("parameters") or {"type": "object", "properties": {}},
            }
            if fn.get("description"):
                spec["description"] = fn["description"]
            if fn.get("strict"):
                spec["strict"] = True
            converted.append(spec)
        out["tools"] = converted
    choice = body.get("tool_choice")
    mapped: dict[str, Any] | None = None
    if choice == "auto" or (choice is None and tools):
        mapped = {"type": "auto"}
    elif choice == "none":
        mapped = {"type": "none"}
    elif choice == "required":
        mapped = {"type": "any"}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        mapped = {"type": "tool", "name": choice["function"].get("name")}
    elif choice is not None:
        raise Refused(f"tool_choice {choice!r} cannot be sent to Anthropic", "tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is False and mapped is not None and mapped["type"] != "none":
        mapped["disable_parallel_tool_use"] = True
    if mapped is not None and (tools or mapped["type"] == "none"):
        out["tool_choice"] = mapped


def _response_format(fmt: Any, out: dict[str, Any]) -> None:
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return
    spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(spec, dict):
        schema = spec.get("schema")
        if isinstance(schema, dict):
            out["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
            return
    raise Refused(
        "Anthropic takes only response_format json_schema with a schema (no json_object)",
        "response_format",
    )


# ---------------------------------------------------------------------------- answers


def to_completion(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` body for an Anthropic ``Message``."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.get("content") or []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            args = orjson.dumps(block.get("input") or {}).decode()
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {"name": str(block.get("name", "")), "arguments": args},
                }
            )
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        reply["tool_calls"] = calls
    usage = message.get("usage") or {}
    prompt = sum(
        int(usage.get(k) or 0)
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    completion = int(usage.get("output_tokens") or 0)
    counts: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    read = int(usage.get("cache_read_input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    if read or written:  # as OpenAI reports cache reads; writes under Anthropic's own name
        counts["prompt_tokens_details"] = {"cached_tokens": read}
        counts["cache_creation_input_tokens"] = written
    return {
        "id": str(message.get("id", "")),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(message.get("model", "")),
        "choices": [
            {
                "index": 0,
                "message": reply,
                "finish_reason": _FINISH.get(str(message.get("stop_reason")), "stop"),
                "logprobs": None,
            }
        ],
        "usage": counts,
    }


_RETRYABLE = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})
_CODES = {
    "invalid_request_error": ErrorCode.invalid_request,
    "authentication_error": ErrorCode.authentication_error,
    "permission_error": ErrorCode.permission_denied,
    "not_found_error": ErrorCode.not_found,
    "request_too_large": ErrorCode.invalid_request,
    "rate_limit_error": ErrorCode.rate_limited,
}


def error_of(error: Any) -> tuple[str, str, bool]:
    """(error code, message, retryable) of an ``errored`` result's ``ErrorResponse``:
    overloaded, api, rate-limit and timeout errors are retryable; the rest are final."""
    inner = error.get("error") if isinstance(error, dict) else None
    if not isinstance(inner, dict):
        inner = error if isinstance(error, dict) else {}
    kind = str(inner.get("type") or "api_error")
    message = f"{kind}: {inner.get('message') or 'the request failed in the batch'}"
    code = _CODES.get(kind, ErrorCode.server_error)
    return code.value, message, kind in _RETRYABLE
