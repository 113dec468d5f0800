"""Protocol types -> OpenAI request bodies.

The protocol's typed arguments (messages, ``SamplingParams``, ``ToolDefinition``,
``ResponseFormat``, ``LogProbConfig``) are converted here, once, into the OpenAI
chat-completions wire form that every provider carries, and :func:`chat_requests` turns one
``batch_chat_completion`` call into its requests (``docs/design.md``: why the internal request
is an OpenAI body).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from .._invalid import describe
from ..errors import ConfigurationError, ErrorCode
from ..types import (
    GrammarResponseFormat,
    GreedySamplingStrategy,
    ImageContentItem,
    InterleavedContent,
    JsonSchemaResponseFormat,
    LogProbConfig,
    Message,
    MessageLike,
    ResponseFormat,
    ResponseFormatArg,
    SamplingParams,
    SystemMessage,
    TextContentItem,
    ToolChoice,
    ToolDefinition,
    ToolParamDefinition,
    ToolPromptFormat,
    ToolResponseMessage,
    TopKSamplingStrategy,
    TopPSamplingStrategy,
    UserMessage,
    coerce_messages,
)
from .calls import aligned, lazy_requests, per_item_sampling
from .request import Request, item_error


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
    model's named call came back with the bare string ``"Paris"`` as its arguments (seen with
    vLLM 0.32's server; ``docs/structured.md``). A tool with
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
    messages: Sequence[Message | dict[str, Any]],
    sampling_params: SamplingParams,
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    tool_choice: ToolChoice | str = ToolChoice.auto,
    response_format: ResponseFormat | None = None,
    logprobs: LogProbConfig | None = None,
) -> dict[str, Any]:
    """The OpenAI chat-completions body for one conversation (``tools`` already in wire form;
    a dict message is taken as already in wire form, see :func:`plain_wire`)."""
    wire = [m if isinstance(m, dict) else message_to_wire(m) for m in messages]
    body: dict[str, Any] = {"model": model, "messages": wire}
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


# ---------------------------------------------------------------------------- a chat batch


def chat_requests(
    model: str,
    messages_batch: Sequence[Sequence[MessageLike]],
    sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    tools: Sequence[ToolDefinition | dict[str, Any]] | None = None,
    tool_choice: ToolChoice | str = ToolChoice.auto,
    tool_prompt_format: ToolPromptFormat | str | None = None,
    response_format: ResponseFormatArg | Sequence[ResponseFormatArg] = None,
    logprobs: LogProbConfig | Sequence[LogProbConfig | None] | None = None,
    custom_ids: Sequence[str] | None = None,
) -> Iterator[Request]:
    """One :class:`Request` per conversation of ``batch_chat_completion``'s arguments.

    The arguments are checked now (``ConfigurationError`` for lists whose length is not the
    number of conversations, a tool choice naming no tool, a bad response format); the requests
    are built lazily (:mod:`.calls`). A conversation that cannot become a request (a malformed
    message) gets an ``invalid_request`` error at its position instead.
    """
    n = len(messages_batch)
    params = per_item_sampling(sampling_params, n, _ITEMS)
    formats: list[ResponseFormat | None]
    formats = aligned("response_format", response_format, n, _ITEMS, _coerce_response_format)
    per_item_logprobs: list[LogProbConfig | None]
    per_item_logprobs = aligned("logprobs", logprobs, n, _ITEMS, _coerce_logprobs)
    wire_tools = _wire_tools(tools, tool_choice)
    prompt_format = _tool_prompt_format(tool_prompt_format)
    tool_schemas = (
        {t["function"]["name"]: t["function"].get("parameters") or {} for t in wire_tools}
        if wire_tools
        else None
    )

    # the sampling fields of each distinct SamplingParams, converted once (a call usually gives
    # one for every conversation); those with a ``stop`` list are converted per body, so no
    # two bodies share a list
    sampling_wire: dict[int, dict[str, Any]] = {}

    def build(i: int, custom_id: str | None) -> Request:
        fmt = formats[i]
        try:
            messages: list[Message] | list[dict[str, Any]] | None = plain_wire(messages_batch[i])
            plain = messages is not None
            if messages is None:
                messages = coerce_messages(list(messages_batch[i]))
            if not messages:
                raise ValueError("the conversation has no messages")
        except (ValidationError, ValueError, TypeError) as exc:
            return Request(
                index=i,
                body={"model": model},
                custom_id=custom_id,
                error=item_error(
                    ErrorCode.invalid_request, f"bad conversation: {_why(exc)}", param="messages"
                ),
            )
        logprobs = per_item_logprobs[i]
        if plain and wire_tools is None and fmt is None and logprobs is None:
            # the common body, as build_body makes it, without its per-item conversions
            sampling = params[i]
            fields = sampling_wire.get(id(sampling))
            if fields is None:
                fields = sampling_to_wire(sampling)
                if "stop" not in fields:
                    sampling_wire[id(sampling)] = fields
            body: dict[str, Any] = {"model": model, "messages": messages}
            body.update(fields)
            return Request(
                index=i, body=body, custom_id=custom_id, tool_prompt_format=prompt_format
            )
        body = build_body(
            model,
            messages,
            params[i],
            tools=wire_tools,
            tool_choice=tool_choice,
            response_format=fmt,
            logprobs=logprobs,
        )
        return Request(
            index=i,
            body=body,
            custom_id=custom_id,
            response_schema=fmt.json_schema if isinstance(fmt, JsonSchemaResponseFormat) else None,
            tool_schemas=tool_schemas,
            tool_prompt_format=prompt_format,
        )

    return lazy_requests(n, custom_ids, _ITEMS, build)


_ITEMS = "conversations"


_PLAIN_ROLES = frozenset({"user", "system", "assistant"})


def plain_wire(conversation: Any) -> list[dict[str, Any]] | None:
    """The conversation's wire form when every message is a plain ``{"role", "content"}`` text
    dict (the common case), else None. These are exactly the messages whose validation and
    conversion give them back unchanged, so the pydantic round trip is skipped for them."""
    if not isinstance(conversation, list | tuple) or not conversation:
        return None
    for m in conversation:
        if (
            type(m) is not dict
            or len(m) != 2
            or m.get("role") not in _PLAIN_ROLES
            or type(m.get("content")) is not str
        ):
            return None
    return [{"role": m["role"], "content": m["content"]} for m in conversation]


def _tool_prompt_format(value: ToolPromptFormat | str | None) -> ToolPromptFormat | None:
    if value is None:
        return None
    try:
        return ToolPromptFormat(value)
    except ValueError:
        raise ConfigurationError(
            f"tool_prompt_format must be one of {[f.value for f in ToolPromptFormat]}"
        ) from None


def _wire_tools(
    tools: Sequence[ToolDefinition | dict[str, Any]] | None, tool_choice: ToolChoice | str
) -> list[dict[str, Any]] | None:
    """The tools in OpenAI form, checked against the tool choice (a whole-call problem)."""
    try:
        wire = [tool_to_wire(t) for t in tools] if tools else None
    except ValidationError as exc:
        raise ConfigurationError(f"bad tool definition: {describe(exc)}") from exc
    names = [str(t.get("function", {}).get("name")) for t in wire or ()]
    choice = tool_choice.value if isinstance(tool_choice, ToolChoice) else str(tool_choice)
    if choice == "required" and not wire:
        raise ConfigurationError("tool_choice 'required' needs tools")
    if choice not in ("auto", "none", "required") and choice not in names:
        raise ConfigurationError(
            f"tool_choice {choice!r} is not a tool's name; tools: {', '.join(names) or 'none'}"
        )
    return wire


_response_format_adapter: TypeAdapter[ResponseFormat] = TypeAdapter(ResponseFormat)


def _coerce_response_format(fmt: ResponseFormatArg) -> ResponseFormat | None:
    if fmt is None or not isinstance(fmt, dict):
        return fmt
    try:
        return _response_format_adapter.validate_python(fmt)
    except ValidationError as exc:
        raise ConfigurationError(f"bad response_format: {describe(exc)}") from exc


def _coerce_logprobs(config: LogProbConfig | dict[str, Any] | None) -> LogProbConfig | None:
    if config is None or isinstance(config, LogProbConfig):
        return config
    try:
        return LogProbConfig.model_validate(config)
    except ValidationError as exc:
        raise ConfigurationError(f"bad logprobs: {describe(exc)}") from exc


def _why(exc: Exception) -> str:
    """An exception's text for a caller: a validation error without pydantic's internals."""
    return describe(exc) if isinstance(exc, ValidationError) else str(exc)
