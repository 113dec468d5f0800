"""The Responses API (``/v1/responses``) over the chat path, both ways.

Servers and batch APIs that speak the Responses API (OpenAI, Azure, vLLM's server, another
``batchclient serve``) get its requests as they are. Everything else (the inline engine, Ray
replicas, Anthropic's and Gemini's batch APIs, a provider of your own that serves chat) runs
them as chat completions: :func:`to_chat` turns a Responses request into a chat request,
:func:`to_response` the chat answer into a ``Response`` object (``openai.types.responses``), so
a ``/v1/responses`` batch gives ``Response`` lines whichever provider runs it.
:class:`ResponsesOverChat` does both around a provider's ``execute``.

What translates (the Responses API reference):

=============================================  ================================================
Responses request                              chat request
=============================================  ================================================
``instructions``                               a first ``system`` message
``input`` text                                 one ``user`` message
``input`` messages (``input_text``,            messages (``text``, ``image_url``, ``file``
``input_image``, ``input_file``, and an        parts; ``output_text`` / ``refusal`` parts of
assistant's ``output_text``)                   an assistant turn as its text)
``function_call`` / ``function_call_output``   an assistant ``tool_calls`` turn / a ``tool``
items                                          message
``reasoning`` items                            left out (a chat model takes no reasoning input)
``max_output_tokens``                          ``max_tokens``
``text.format`` (``json_schema``,              ``response_format`` (checked as structured
``json_object``, ``text``)                     output is)
function ``tools``, ``tool_choice``            ``tools`` (``function``), ``tool_choice``
``reasoning.effort``                           ``reasoning_effort``
``temperature``, ``top_p``, ``top_logprobs``,  the same
``parallel_tool_calls``, ``service_tier``,
``prompt_cache_key``, ``safety_identifier``,
``user``, ``metadata``
``store``, ``truncation: "disabled"``,         nothing (no state is kept between requests)
``reasoning.summary``
=============================================  ================================================

Anything else (``previous_response_id``, ``conversation``, ``background``, built-in tools,
``include``, a prompt template) is the item's ``unsupported_parameter`` error naming the field:
never dropped, never the whole batch.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from ..errors import ErrorCode
from ..types import Endpoint
from .provider import DelegatingProvider, Provider
from .request import Request, Result, failed
from .usage import token_counts

__all__ = [
    "ResponsesOverChat",
    "Unsupported",
    "answered",
    "as_chat",
    "from_chat",
    "over_chat",
    "schemas",
    "serves",
    "to_chat",
    "to_completion",
    "to_response",
]

_PASSED = (
    "model",
    "temperature",
    "top_p",
    "top_logprobs",
    "parallel_tool_calls",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "user",
    "metadata",
)
_IGNORED = frozenset(
    {"store", "stream", "instructions", "input", "max_output_tokens", "text", "tools"}
    | {"tool_choice", "reasoning", "truncation"}
)
"""Read by :func:`to_chat` itself (translated), or with nothing to carry to a chat request."""
_ROLES = frozenset({"user", "assistant", "system", "developer"})


class Unsupported(Exception):
    """A Responses field the chat path cannot carry: ``param`` (the body's field) and a
    message."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


# ---------------------------------------------------------------------- requests


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request (``/v1/chat/completions`` body) for a Responses request ``body``
    (module docstring).

    Raises:
        Unsupported: a field or an input item the chat path cannot carry.
    """
    for key in body:
        if key not in _PASSED and key not in _IGNORED:
            raise Unsupported(key, f"{key} is not supported on this provider's /v1/responses")
    if body.get("truncation") not in (None, "disabled"):
        raise Unsupported("truncation", "truncation 'auto' is not supported on this provider")
    chat: dict[str, Any] = {k: body[k] for k in _PASSED if k in body}
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    elif instructions is not None and not isinstance(instructions, str):
        raise Unsupported("instructions", "instructions must be text")
    messages += _messages(body.get("input"))
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    fmt = _format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    tools = body.get("tools")
    if tools:
        chat["tools"] = [_tool(tool) for tool in tools]
    if "tool_choice" in body:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    return chat


def _messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise Unsupported("input", "input must be text or a non-empty list of input items")
    out: list[dict[str, Any]] = []
    for n, item in enumerate(value):
        if not isinstance(item, dict):
            raise Unsupported("input", f"input[{n}] must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise Unsupported("input", f"input[{n}].role {role!r} is not a message role")
            out.append({"role": role, "content": _content(item.get("content"), n)})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, n)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue  # a previous answer's reasoning: no chat model takes it as input
        else:
            raise Unsupported("input", f"input[{n}] of type {kind!r} is not supported here")
    if not any(m["role"] != "system" for m in out):
        raise Unsupported("input", "input has no user or assistant turn")
    return out


def _content(content: Any, n: int) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Unsupported("input", f"input[{n}].content must be text or a list of parts")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part, dict):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "refusal" and isinstance(part, dict):
            parts.append({"type": "text", "text": part.get("refusal", "")})
        elif kind == "input_image" and isinstance(part, dict) and part.get("image_url"):
            image = {"url": part["image_url"]}
            if part.get("detail") is not None:
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        elif kind == "input_file" and isinstance(part, dict) and part.get("file_data"):
            file = {k: part[k] for k in ("file_data", "filename") if k in part}
            parts.append({"type": "file", "file": file})
        else:
            raise Unsupported("input", f"input[{n}] has a content part {kind!r} not supported here")
    return parts


def _text_of(parts: Any, n: int) -> str:
    content = _content(parts, n)
    if isinstance(content, str):
        return content
    texts = [p["text"] for p in content if p["type"] == "text"]
    if len(texts) != len(content):
        raise Unsupported("input", f"input[{n}].output must be text")
    return "".join(texts)


def _format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise Unsupported("text", "text must be an object")
    unknown = set(text) - {"format"}
    if unknown:
        raise Unsupported(f"text.{sorted(unknown)[0]}", "only text.format is supported here")
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        inner = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": inner}
    raise Unsupported("text.format", "text.format must be text, json_object or json_schema")


def _tool(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise Unsupported("tools", f"only function tools are supported here, not {kind!r}")
    fields = ("name", "description", "parameters", "strict")
    return {"type": "function", "function": {k: tool[k] for k in fields if k in tool}}


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise Unsupported("tool_choice", "tool_choice must be auto, none, required or a function")


# ---------------------------------------------------------------------- answers


def to_response(completion: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The ``Response`` object for a ``chat.completion`` answer ``completion`` to the
    Responses request ``request``: its first choice as ``output`` items (a ``reasoning`` item
    with the reasoning text as its summary where the model gave one, a ``message`` with
    ``output_text`` or ``refusal``, ``function_call`` items), ``status`` ``incomplete`` with
    ``incomplete_details.reason`` for a cut answer, ``usage`` in the Responses shape (input,
    cached, output and reasoning tokens), and the request's settings echoed."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    message = choice.get("message") if isinstance(choice, dict) else None
    message = message if isinstance(message, dict) else {}
    base = str(completion.get("id") or f"{time.time_ns():x}")
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        summary = [{"type": "summary_text", "text": reasoning}]
        output.append({"type": "reasoning", "id": f"rs_{base}", "summary": summary})
    parts: list[dict[str, Any]] = []
    if isinstance(message.get("content"), str) and message["content"]:
        parts.append({"type": "output_text", "text": message["content"], "annotations": []})
    if isinstance(message.get("refusal"), str) and message["refusal"]:
        parts.append({"type": "refusal", "refusal": message["refusal"]})
    if parts:
        output.append(
            {"type": "message", "id": f"msg_{base}", "role": "assistant", "status": "completed",
             "content": parts}
        )  # fmt: skip
    for n, call in enumerate(message.get("tool_calls") or ()):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        output.append(
            {"type": "function_call", "id": f"fc_{base}_{n}", "call_id": call.get("id") or "",
             "name": function.get("name") or "", "arguments": function.get("arguments") or "",
             "status": "completed"}
        )  # fmt: skip
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    incomplete = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(
        str(finish)
    )
    response: dict[str, Any] = {
        "id": base if base.startswith("resp_") else f"resp_{base}",
        "object": "response",
        "created_at": completion.get("created") or int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "error": None,
        "model": completion.get("model") or request.get("model"),
        "output": output,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "temperature": request.get("temperature"),
        "top_p": request.get("top_p"),
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "text": request.get("text") or {"format": {"type": "text"}},
        "metadata": request.get("metadata") or {},
    }
    if isinstance(request.get("reasoning"), dict):
        response["reasoning"] = request["reasoning"]
    usage = completion.get("usage")
    if isinstance(usage, dict):
        response["usage"] = _usage(usage)
    return response


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    def count(value: Any) -> int:
        return value if type(value) is int and value > 0 else 0

    def detail(key: str, name: str) -> int:
        found = usage.get(key)
        return count(found.get(name)) if isinstance(found, dict) else 0

    prompt, completion = count(usage.get("prompt_tokens")), count(usage.get("completion_tokens"))
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": detail("prompt_tokens_details", "cached_tokens"),
            "cache_write_tokens": count(usage.get("cache_creation_input_tokens")),
        },
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": detail("completion_tokens_details", "reasoning_tokens")
        },
        "total_tokens": prompt + completion,
    }


# ---------------------------------------------------------------------- providers


def serves(provider: Provider) -> frozenset[Endpoint]:
    """``provider``'s endpoints, with ``/v1/responses`` where it serves chat (the Responses
    requests then run as chat)."""
    endpoints = provider.endpoints
    if Endpoint.chat_completions in endpoints and Endpoint.responses not in endpoints:
        return endpoints | {Endpoint.responses}
    return endpoints


def as_chat(request: Request) -> Request | Result:
    """A ``/v1/responses`` request as the chat request it runs as, or its refusal (the
    item's ``unsupported_parameter``)."""
    try:
        body = to_chat(request.body)
    except Unsupported as exc:
        return failed(ErrorCode.unsupported_parameter, exc.message, param=exc.param)
    return replace(request, body=body, endpoint=Endpoint.chat_completions)


def answered(request: Request, result: Result) -> Result:
    """``result`` of a Responses ``request`` that ran as chat, with its ``chat.completion``
    body made a ``Response`` (a refusal or an error body stays as it is)."""
    body = result.body
    if (
        result.error is None
        and isinstance(body, dict)
        and body.get("object") == "chat.completion"
        and result.status_code is not None
        and 200 <= result.status_code < 300
    ):
        return replace(result, body=to_response(body, request.body))
    return result


class ResponsesOverChat(DelegatingProvider):
    """``inner`` (a provider that serves chat but not ``/v1/responses``) with Responses
    requests run as chat (module docstring); everything else passes through."""

    @property
    def endpoints(self) -> frozenset[Endpoint]:  # type: ignore[override]  # read-only here
        return serves(self.inner)

    async def execute(self, request: Request) -> Result:
        if request.endpoint is not Endpoint.responses or request.endpoint in self.inner.endpoints:
            return await self.inner.execute(request)
        chat = as_chat(request)
        if isinstance(chat, Result):
            return chat
        return answered(request, await self.inner.execute(chat))


def over_chat(provider: Provider) -> Provider:
    """``provider`` itself where it speaks the Responses API or serves no chat, else
    :class:`ResponsesOverChat` around it."""
    if Endpoint.responses in provider.endpoints or isinstance(provider, ResponsesOverChat):
        return provider
    return ResponsesOverChat(provider)


def to_completion(response: Any) -> dict[str, Any] | None:
    """The ``chat.completion`` a ``Response`` object stands for (its output as one assistant
    message: text, refusal, tool calls, the reasoning summary as ``reasoning_content``), with
    the usage in the chat shape; None when ``response`` is not a usable ``Response`` (no
    ``output`` list, or ``status`` ``failed``)."""
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        return None
    if response.get("status") == "failed":
        return None
    texts: list[str] = []
    refusals: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in response["output"]:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("type") == "output_text":
                    texts.append(str(part.get("text") or ""))
                elif isinstance(part, dict) and part.get("type") == "refusal":
                    refusals.append(str(part.get("refusal") or ""))
        elif kind == "function_call":
            calls.append(
                {"id": item.get("call_id") or item.get("id") or "", "type": "function",
                 "function": {"name": item.get("name") or "",
                              "arguments": item.get("arguments") or ""}}
            )  # fmt: skip
        elif kind == "reasoning":
            for part in [*(item.get("summary") or ()), *(item.get("content") or ())]:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    reasoning.append(part["text"])
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if refusals:
        message["refusal"] = "".join(refusals)
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    finish = "tool_calls" if calls else "stop"
    if response.get("status") == "incomplete":
        finish = "content_filter" if reason == "content_filter" else "length"
    completion: dict[str, Any] = {
        "id": str(response.get("id") or ""),
        "object": "chat.completion",
        "created": response.get("created_at") or 0,
        "model": str(response.get("model") or ""),
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
    }
    usage = response.get("usage")
    if isinstance(usage, dict):
        counts = token_counts(usage)
        completion["usage"] = {
            "prompt_tokens": counts.prompt,
            "completion_tokens": counts.completion,
            "total_tokens": counts.prompt + counts.completion,
            "prompt_tokens_details": {"cached_tokens": counts.cached},
            "completion_tokens_details": {"reasoning_tokens": counts.reasoning},
        }
        if counts.cache_write:
            completion["usage"]["cache_creation_input_tokens"] = counts.cache_write
    return completion


def schemas(body: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
    """What a Responses request's answer is checked against: ``text.format``'s JSON schema,
    and each function tool's ``parameters`` by name."""
    schema = None
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if (
        isinstance(fmt, dict)
        and fmt.get("type") == "json_schema"
        and isinstance(fmt.get("schema"), dict)
    ):
        schema = fmt["schema"]
    tools: dict[str, dict[str, Any]] = {}
    for tool in body.get("tools") or ():
        if isinstance(tool, dict) and tool.get("type") == "function" and tool.get("name"):
            params = tool.get("parameters")
            tools[str(tool["name"])] = params if isinstance(params, dict) else {}
    return schema, tools


# ---------------------------------------------------------------------- chat sent as Responses

_CHAT_PASSED = (
    "model",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "user",
    "metadata",
    "store",
)
_CHAT_READ = frozenset(
    {"messages", "max_tokens", "max_completion_tokens", "response_format", "tools"}
    | {"tool_choice", "reasoning_effort", "stream", "n"}
)


def from_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The Responses request (``/v1/responses`` body) for a chat request ``body``, for a model
    served only there: leading ``system`` / ``developer`` messages -> ``instructions``, the
    other turns -> ``input`` items (text and image parts, tool calls and their results),
    ``max_tokens`` -> ``max_output_tokens``, ``response_format`` -> ``text.format``, function
    ``tools``, ``tool_choice``, ``reasoning_effort`` -> ``reasoning`` (with the ``auto``
    summary, kept as the answer's ``reasoning_content``); ``store`` false unless the body
    says otherwise (a batch keeps its own answers).

    Raises:
        Unsupported: a field the Responses API has no place for (``stop``, ``seed``,
            ``logprobs``, ``n`` over 1, penalties, ``logit_bias``, ...).
    """
    for key in body:
        if key not in _CHAT_PASSED and key not in _CHAT_READ:
            raise Unsupported(key, f"{key} has no place in a Responses request (api='responses')")
    if body.get("n") not in (None, 1):
        raise Unsupported("n", "the Responses API gives one answer per request: n must be 1")
    out: dict[str, Any] = {k: body[k] for k in _CHAT_PASSED if k in body}
    out.setdefault("store", False)
    messages = body.get("messages") or []
    system: list[str] = []
    while messages and messages[0].get("role") in ("system", "developer"):
        system.append(_chat_text(messages[0].get("content"), "messages"))
        messages = messages[1:]
    if system:
        out["instructions"] = "\n\n".join(system)
    out["input"] = [item for message in messages for item in _input_items(message)]
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        out["max_output_tokens"] = limit
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        given = fmt.get("json_schema")
        inner: dict[str, Any] = given if isinstance(given, dict) else {}
        fields = ("name", "schema", "strict", "description")
        schema = {k: inner[k] for k in fields if k in inner}
        out["text"] = {"format": {"type": "json_schema", **schema}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["text"] = {"format": {"type": "json_object"}}
    tools = body.get("tools")
    if tools:
        out["tools"] = [_responses_tool(tool) for tool in tools]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        out["tool_choice"] = {"type": "function", "name": name}
    elif choice is not None:
        out["tool_choice"] = choice
    if body.get("reasoning_effort") is not None:
        out["reasoning"] = {"effort": body["reasoning_effort"], "summary": "auto"}
    return out


def _chat_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" for p in content
    ):
        return "".join(str(p.get("text", "")) for p in content)
    raise Unsupported(param, "a system message must be text to become instructions")


def _input_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    role = message.get("role")
    if role == "tool":
        output = _chat_text(message.get("content"), "messages")
        return [{"type": "function_call_output", "call_id": message.get("tool_call_id"),
                 "output": output}]  # fmt: skip
    items: list[dict[str, Any]] = []
    content = message.get("content")
    if content not in (None, "", []):
        items.append({"type": "message", "role": role, "content": _parts(content, role)})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        items.append(
            {"type": "function_call", "call_id": call.get("id"), "name": function.get("name"),
             "arguments": function.get("arguments", "")}
        )  # fmt: skip
    return items


def _parts(content: Any, role: Any) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Unsupported("messages", "message content must be text or a list of parts")
    text_type = "output_text" if role == "assistant" else "input_text"
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part, dict):
            parts.append({"type": text_type, "text": part.get("text", "")})
        elif kind == "image_url" and isinstance(part, dict):
            image = part.get("image_url") or {}
            url = image.get("url") if isinstance(image, dict) else image
            item = {"type": "input_image", "image_url": url, "detail": "auto"}
            if isinstance(image, dict) and image.get("detail"):
                item["detail"] = image["detail"]
            parts.append(item)
        elif kind == "file" and isinstance(part, dict):
            file = part.get("file") or {}
            parts.append(
                {"type": "input_file", **{k: v for k, v in file.items() if k != "file_id"}}
            )
        else:
            raise Unsupported("messages", f"a content part {kind!r} has no Responses form here")
    return parts


def _responses_tool(tool: Any) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or tool.get("type") != "function":
        raise Unsupported("tools", "only function tools are sent as Responses tools")
    fields = ("name", "description", "parameters", "strict")
    return {"type": "function", **{k: function[k] for k in fields if k in function}}
