"""An OpenAI chat body as a Gemini ``GenerateContentRequest``, and a Gemini
``GenerateContentResponse`` back as an OpenAI ``chat.completion`` body (Gemini API reference:
``models.generateContent``, REST field names).

What is kept, and what is refused with :class:`Unsupported` (the caller makes it that item's
``unsupported_parameter`` error instead of dropping it silently): ``docs/batch-api.md``, "What
the translation keeps, and refuses".
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

__all__ = ["MAX_STOP", "Unsupported", "status_of", "to_completion", "to_request"]

MAX_STOP = 5
"""Gemini's limit on ``stopSequences``."""

_FINISH = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}

# Fields with a value that asks for nothing Gemini lacks: accepted without being sent.
_HARMLESS: dict[str, tuple[Any, ...]] = {
    "stream": (False, None),
    "logprobs": (False, None),
    "parallel_tool_calls": (True, None),
    "store": (False, None),
    "n": (1, None),
}
_GENERATION = {
    "temperature": "temperature",
    "top_p": "topP",
    "top_k": "topK",
    "seed": "seed",
    "presence_penalty": "presencePenalty",
    "frequency_penalty": "frequencyPenalty",
}
_HANDLED = frozenset(
    {"model", "messages", "max_tokens", "max_completion_tokens", "stop", "n", "response_format"}
    | {"tools", "tool_choice"}
    | set(_GENERATION)
)
_DATA_URL = re.compile(r"^data:([\w.+-]+/[\w.+-]+);base64,(.*)$", re.DOTALL)


class Unsupported(Exception):
    """A field of the body that Gemini cannot honour: ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


# ---------------------------------------------------------------------------- request


def to_request(body: dict[str, Any]) -> dict[str, Any]:
    """The ``GenerateContentRequest`` (REST JSON, without ``model``) for an OpenAI chat body.

    Raises:
        Unsupported: a field, or a value, that Gemini cannot honour.
    """
    for key, value in body.items():
        if key in _HANDLED:
            continue
        if key in _HARMLESS and value in _HARMLESS[key]:
            continue
        raise Unsupported(key, f"{key}={_short(value)} is not supported by the Gemini Batch API")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Unsupported("messages", "messages must be a non-empty list")
    system, contents = _contents(messages)
    request: dict[str, Any] = {"contents": contents}
    if system:
        request["systemInstruction"] = {"parts": system}
    config = _generation_config(body)
    if config:
        request["generationConfig"] = config
    tools = body.get("tools")
    if tools:
        request["tools"] = [
            {"functionDeclarations": [_declaration(t, i) for i, t in enumerate(tools)]}
        ]
    choice = body.get("tool_choice")
    if choice is not None:
        request["toolConfig"] = {"functionCallingConfig": _calling_config(choice, bool(tools))}
    return request


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _generation_config(body: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        config["maxOutputTokens"] = limit
    for field, name in _GENERATION.items():
        if body.get(field) is not None:
            config[name] = body[field]
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else list(stop)
        if len(stops) > MAX_STOP:
            raise Unsupported("stop", f"Gemini takes at most {MAX_STOP} stop sequences")
        if stops:
            config["stopSequences"] = stops
    n = body.get("n")
    if n is not None and n != 1:
        config["candidateCount"] = n
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        kind = fmt.get("type")
        if kind == "json_object":
            config["responseMimeType"] = "application/json"
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise Unsupported("response_format", "json_schema needs json_schema.schema")
            config["responseMimeType"] = "application/json"
            config["responseJsonSchema"] = schema
        else:
            raise Unsupported("response_format", f"response_format type {kind!r} is not supported")
    elif fmt is not None and not isinstance(fmt, dict):
        raise Unsupported("response_format", "response_format must be an object")
    return config


def _declaration(tool: Any, i: int) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
        raise Unsupported(f"tools[{i}]", "only function tools are supported")
    out: dict[str, Any] = {"name": fn.get("name")}
    if fn.get("description"):
        out["description"] = fn["description"]
    if fn.get("parameters") is not None:
        out["parametersJsonSchema"] = fn["parameters"]
    return out


def _calling_config(choice: Any, has_tools: bool) -> dict[str, Any]:
    if choice in ("auto", "none", "required"):
        return {"mode": {"auto": "AUTO", "none": "NONE", "required": "ANY"}[choice]}
    fn = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("name"), str) and has_tools:
        return {"mode": "ANY", "allowedFunctionNames": [fn["name"]]}
    raise Unsupported("tool_choice", f"tool_choice {_short(choice)} is not supported")


def _contents(messages: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system parts, contents). Consecutive tool answers share one ``user`` turn, as Gemini
    wants every ``functionResponse`` of a turn together."""
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise Unsupported(where, "a message must be an object")
        role = msg.get("role")
        for key in msg:
            if key not in ("role", "content", "tool_calls", "tool_call_id", "refusal"):
                raise Unsupported(f"{where}.{key}", f"message field {key!r} is not supported")
        if role in ("system", "developer"):
            system.extend(_parts(msg.get("content"), where, text_only=True))
        elif role == "user":
            contents.append({"role": "user", "parts": _parts(msg.get("content"), where)})
        elif role == "assistant":
            parts = _parts(msg.get("content"), where, text_only=True, optional=True)
            if not parts and isinstance(msg.get("refusal"), str):
                parts = [{"text": msg["refusal"]}]  # what the model said, kept in the history
            for j, call in enumerate(msg.get("tool_calls") or []):
                parts.append(_function_call(call, f"{where}.tool_calls[{j}]", call_names))
            if not parts:
                raise Unsupported(f"{where}.content", "an assistant message needs content")
            contents.append({"role": "model", "parts": parts})
        elif role == "tool":
            call_id = msg.get("tool_call_id")
            name = call_names.get(call_id) if isinstance(call_id, str) else None
            if name is None:
                raise Unsupported(f"{where}.tool_call_id", "answers no earlier tool call")
            part = {"functionResponse": {"name": name, "response": _tool_answer(msg, where)}}
            last = contents[-1] if contents else None
            if last and last["role"] == "user" and "functionResponse" in last["parts"][-1]:
                last["parts"].append(part)
            else:
                contents.append({"role": "user", "parts": [part]})
        else:
            raise Unsupported(f"{where}.role", f"role {role!r} is not supported")
    if not contents:
        raise Unsupported("messages", "Gemini needs at least one non-system message")
    return system, contents


def _function_call(call: Any, where: str, names: dict[str, str]) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise Unsupported(where, "a tool call needs function.name")
    raw = fn.get("arguments") or "{}"
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        raise Unsupported(f"{where}.function.arguments", "arguments are not JSON") from None
    if not isinstance(args, dict):
        raise Unsupported(f"{where}.function.arguments", "arguments must be a JSON object")
    if isinstance(call.get("id"), str):
        names[call["id"]] = fn["name"]
    return {"functionCall": {"name": fn["name"], "args": args}}


def _tool_answer(msg: dict[str, Any], where: str) -> dict[str, Any]:
    text = "".join(p["text"] for p in _parts(msg.get("content"), where, text_only=True))
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    # Gemini wants an object; a plain answer goes under "content" (its docs' own convention)
    return value if isinstance(value, dict) else {"content": text}


def _parts(
    content: Any, where: str, *, text_only: bool = False, optional: bool = False
) -> list[dict[str, Any]]:
    if content is None:
        if optional:
            return []
        raise Unsupported(f"{where}.content", "the message has no content")
    if isinstance(content, str):
        return [{"text": content}]
    if not isinstance(content, list):
        raise Unsupported(f"{where}.content", "content must be a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"text": part["text"]})
        elif text_only:
            raise Unsupported(at, f"a {kind!r} part is not supported in this message")
        elif kind == "image_url":
            url = part.get("image_url", {})
            parts.append(_inline(url.get("url") if isinstance(url, dict) else url, at))
        elif kind == "input_audio" and isinstance(part.get("input_audio"), dict):
            audio = part["input_audio"]
            mime = f"audio/{audio.get('format', 'wav')}"
            parts.append({"inlineData": {"mimeType": mime, "data": audio.get("data")}})
        elif kind == "file" and isinstance(part.get("file"), dict):
            parts.append(_inline(part["file"].get("file_data"), at))
        else:
            raise Unsupported(at, f"a {kind!r} content part is not supported")
    return parts


def _inline(url: Any, at: str) -> dict[str, Any]:
    match = _DATA_URL.match(url) if isinstance(url, str) else None
    if match is None:
        # Gemini reads only uploaded files or inline data: a web URL would be fetched by nobody
        raise Unsupported(at, "only inline base64 data: URLs are supported")
    return {"inlineData": {"mimeType": match.group(1), "data": match.group(2)}}


# ---------------------------------------------------------------------------- response


def to_completion(response: dict[str, Any], model: str, key: str) -> dict[str, Any]:
    """The ``chat.completion`` body for a ``GenerateContentResponse`` (REST JSON). ``model``:
    the request's, when the response names no ``modelVersion``; ``key``: the item's key, part
    of the completion id when the response has no ``responseId``."""
    choices: list[dict[str, Any]] = []
    for i, candidate in enumerate(response.get("candidates") or []):
        if isinstance(candidate, dict):
            choices.append(_choice(candidate, i, key))
    if not choices:  # the prompt itself was blocked (promptFeedback.blockReason)
        choices.append(
            {
                "index": 0,
                "message": {"role": "assistant", "content": None},
                "finish_reason": "content_filter",
                "logprobs": None,
            }
        )
    body: dict[str, Any] = {
        "id": f"chatcmpl-{response.get('responseId') or key}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": response.get("modelVersion") or model,
        "choices": choices,
    }
    usage = response.get("usageMetadata")
    if isinstance(usage, dict):
        body["usage"] = _usage(usage)
    return body


def _choice(candidate: dict[str, Any], i: int, key: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    parts = (candidate.get("content") or {}).get("parts") or []
    for part in parts:
        if not isinstance(part, dict) or part.get("thought"):
            continue  # thought summaries are not the answer
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        call = part.get("functionCall")
        if isinstance(call, dict):
            call_id = call.get("id") or f"call_{key}_{i}_{len(calls)}"
            arguments = json.dumps(call.get("args") or {}, ensure_ascii=False)
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.get("name"), "arguments": arguments},
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    reason = str(candidate.get("finishReason") or "STOP")
    finish = "tool_calls" if calls and reason == "STOP" else _FINISH.get(reason, "stop")
    index = candidate.get("index")
    return {
        "index": index if isinstance(index, int) else i,
        "message": message,
        "finish_reason": finish,
        "logprobs": None,
    }


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    prompt = int(usage.get("promptTokenCount") or 0)
    thoughts = int(usage.get("thoughtsTokenCount") or 0)
    completion = int(usage.get("candidatesTokenCount") or 0) + thoughts
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": int(usage.get("totalTokenCount") or prompt + completion),
    }
    if thoughts:
        out["completion_tokens_details"] = {"reasoning_tokens": thoughts}
    cached = usage.get("cachedContentTokenCount")
    if cached:
        out["prompt_tokens_details"] = {"cached_tokens": int(cached)}
    return out


# gRPC status codes (google.rpc.Code) of a per-request error -> the HTTP status they stand for
_GRPC_HTTP = {
    1: 499, 2: 500, 3: 400, 4: 504, 5: 404, 6: 409, 7: 403, 8: 429, 9: 400, 10: 409,
    11: 400, 12: 501, 13: 500, 14: 503, 15: 500, 16: 401,
}  # fmt: skip


def status_of(error: dict[str, Any]) -> int:
    """The HTTP status of a per-request ``google.rpc.Status`` error (its ``code`` is a gRPC
    code; an HTTP-looking one is taken as it is)."""
    code = error.get("code")
    if isinstance(code, int) and code >= 100:
        return code
    return _GRPC_HTTP.get(code, 500) if isinstance(code, int) else 500


# ---------------------------------------------------------------------- embeddings

_EMBED_FIELDS = frozenset({"model", "input", "dimensions", "encoding_format", "user"})


def embedding_request(body: dict[str, Any]) -> dict[str, Any]:
    """The ``EmbedContentRequest`` (REST JSON, ``model`` left to the caller) for an OpenAI
    ``/v1/embeddings`` body of one text: ``input`` -> ``content.parts[0].text``,
    ``dimensions`` -> ``outputDimensionality``; Gemini answers floats, made base64 where
    ``encoding_format`` asks it when the row is stored (``_core.embeddings.as_requested``).

    Raises:
        Unsupported: token ids or several texts in one request (one text per request here),
            an unknown ``encoding_format``, any other field.
    """
    for key in body:
        if key not in _EMBED_FIELDS:
            raise Unsupported(key, f"{key} is not supported by Gemini batch embeddings")
    value = body.get("input")
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str) or not value:
        raise Unsupported("input", "Gemini batch embeddings take one non-empty text per request")
    if body.get("encoding_format") not in (None, "float", "base64"):
        raise Unsupported("encoding_format", "encoding_format must be float or base64")
    request: dict[str, Any] = {"content": {"parts": [{"text": value}]}}
    if body.get("dimensions") is not None:
        request["outputDimensionality"] = body["dimensions"]
    return request


def to_embedding(response: dict[str, Any], model: str) -> dict[str, Any]:
    """The OpenAI ``/v1/embeddings`` answer (one ``embedding``) for an ``EmbedContentResponse``.

    Raises:
        ValueError: no list of numbers in ``embedding.values``.
    """
    embedding = response.get("embedding")
    values = embedding.get("values") if isinstance(embedding, dict) else None
    if not isinstance(values, list) or not values:
        raise ValueError("the answer has no embedding values")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise ValueError("the embedding values are not all numbers")
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [float(v) for v in values]}],
        "model": model,
        "usage": {"prompt_tokens": 0, "total_tokens": 0},  # Gemini reports none per request
    }
