"""Checks on answers: tool-call arguments against the tool's schema, constrained answers
against their JSON schema (the ``jsonschema`` package).

Evals grade by parsing answers, so an answer that does not have the shape that was asked for is
that item's error (``invalid_tool_call`` / ``invalid_structured_output``) with the raw text kept,
never a success with a malformed payload (case C17; GUIDE.md: the vLLM server here returned the
bare string ``"Paris"`` as the arguments of a named tool call).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import jsonschema

from .errors import ErrorCode
from .types import BatchItemError, ToolCall

if TYPE_CHECKING:
    from ._wire import ChatRequest


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)  # type: ignore[no-any-return]


def schema_errors(schema: dict[str, Any], value: Any) -> list[str]:
    """Human-readable reasons why ``value`` does not match ``schema`` (empty when it does)."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    return [
        f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in validator.iter_errors(value)
    ]


def _bad(code: ErrorCode, message: str, raw: str, param: str) -> BatchItemError:
    return BatchItemError(code=code.value, message=message, raw_output=raw, param=param)


def parse_tool_calls(
    request: ChatRequest, wire_calls: list[Any]
) -> tuple[list[ToolCall], BatchItemError | None]:
    """OpenAI ``message.tool_calls`` to ``ToolCall`` objects, each checked against its tool."""
    calls: list[ToolCall] = []
    schemas = request.tool_schemas or {}
    for i, call in enumerate(wire_calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            return [], _bad(
                ErrorCode.invalid_tool_call,
                f"tool call {i} has no function",
                json.dumps(call),
                "tools",
            )
        name = fn.get("name") or ""
        raw_args = fn.get("arguments")
        raw_text = raw_args if isinstance(raw_args, str) else json.dumps(raw_args)
        try:
            args = json.loads(raw_args) if isinstance(raw_args, str) else raw_args
        except ValueError as exc:
            return [], _bad(
                ErrorCode.invalid_tool_call,
                f"arguments of tool call {name!r} are not JSON: {exc}",
                raw_text,
                "tools",
            )
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return [], _bad(
                ErrorCode.invalid_tool_call,
                f"arguments of tool call {name!r} are not a JSON object: {raw_text}",
                raw_text,
                "tools",
            )
        if schemas and name not in schemas:
            return [], _bad(
                ErrorCode.invalid_tool_call,
                f"the model called unknown tool {name!r}; tools: {', '.join(schemas)}",
                raw_text,
                "tools",
            )
        if name in schemas:
            problems = schema_errors(schemas[name], args)
            if problems:
                return [], _bad(
                    ErrorCode.invalid_tool_call,
                    f"arguments of tool call {name!r} do not match its schema: "
                    + "; ".join(problems),
                    raw_text,
                    "tools",
                )
        calls.append(
            ToolCall(call_id=str(call.get("id") or f"call_{i}"), tool_name=name, arguments=args)
        )
    return calls, None


def check_answer(
    request: ChatRequest, message: dict[str, Any], text: str
) -> tuple[list[ToolCall], BatchItemError | None]:
    """Parse and check one answer: returns its tool calls, or the item's error."""
    wire_calls = message.get("tool_calls") or []
    if wire_calls:
        return parse_tool_calls(request, wire_calls)
    if request.response_schema is not None:
        try:
            value = json.loads(text)
        except ValueError as exc:
            return [], _bad(
                ErrorCode.invalid_structured_output,
                f"answer is not valid JSON: {exc}",
                text,
                "response_format",
            )
        problems = schema_errors(request.response_schema, value)
        if problems:
            return [], _bad(
                ErrorCode.invalid_structured_output,
                f"answer does not match the schema: {'; '.join(problems)}",
                text,
                "response_format",
            )
    return [], None
