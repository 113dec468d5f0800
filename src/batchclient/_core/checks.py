"""Checks on answers: tool-call arguments against the tool's schema, constrained answers
against their JSON schema (the ``jsonschema`` package).

Evals grade by parsing answers, so an answer that does not have the shape that was asked for is
that item's error (``invalid_tool_call`` / ``invalid_structured_output``) with the raw text kept,
never a success with a malformed payload (crmne/ruby_llm #894: 0 of 502 batch answers had the
schema's shape; vLLM 0.32's server returned the bare string ``"Paris"`` as the arguments of a
named tool call). Guide: ``docs/structured.md``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import jsonschema

from ..errors import ErrorCode
from ..types import BatchItemError, ToolCall

if TYPE_CHECKING:
    from .request import Request


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
    request: Request, wire_calls: list[Any]
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
                json.dumps(call, default=str),
                "tools",
            )
        name = fn.get("name") or ""
        raw_args = fn.get("arguments")
        raw_text = raw_args if isinstance(raw_args, str) else json.dumps(raw_args, default=str)
        if not isinstance(name, str):
            return [], _bad(
                ErrorCode.invalid_tool_call,
                f"tool call {i} has a function name that is not a string",
                raw_text,
                "tools",
            )
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


def _forced_choice(body: dict[str, Any]) -> str | None:
    """``required`` or the forced tool's name when the body forces a tool call, else None."""
    if not body.get("tools"):
        return None
    choice = body.get("tool_choice")
    if choice == "required":
        return "required"
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else None


def grammar_of(body: dict[str, Any]) -> str | None:
    """The grammar a request's answer is constrained by (vLLM's ``structured_outputs``)."""
    extra = body.get("structured_outputs")
    grammar = extra.get("grammar") if isinstance(extra, dict) else None
    return grammar if isinstance(grammar, str) else None


def check_answer(
    request: Request, message: dict[str, Any], text: str, finish_reason: str = "stop"
) -> tuple[list[ToolCall], BatchItemError | None]:
    """Parse and check one answer: returns its tool calls, or the item's error.

    Tool calls are checked against their tool's parameter schema, and a forced tool choice
    (``required`` or a tool's name) must have produced one; a JSON answer is checked against
    ``request.response_schema``. A grammar-constrained answer cannot be re-checked without a
    grammar engine here; the engine enforces it, and an answer cut off by ``max_tokens``
    (``finish_reason: length``) is reported, since it may stop mid-grammar.
    """
    wire_calls = message.get("tool_calls") or []
    forced = _forced_choice(request.body)
    if not isinstance(wire_calls, list):
        return [], _bad(
            ErrorCode.invalid_tool_call,
            "tool_calls is not a list",
            json.dumps(wire_calls, default=str)[:500],
            "tools",
        )
    if wire_calls:
        calls, problem = parse_tool_calls(request, wire_calls)
        other = [c.tool_name for c in calls if forced not in (None, "required", c.tool_name)]
        if problem is None and other:
            problem = _bad(
                ErrorCode.invalid_tool_call,
                f"tool_choice is {forced!r} but the model called {other[0]!r}",
                json.dumps(wire_calls, default=str),
                "tool_choice",
            )
        return ([], problem) if problem is not None else (calls, None)
    if forced is not None:
        cut = " (cut off by max_tokens)" if finish_reason == "length" else ""
        return [], _bad(
            ErrorCode.invalid_tool_call,
            f"tool_choice {forced!r} asks for a tool call, but the answer has none{cut}",
            text,
            "tool_choice",
        )
    if finish_reason == "length" and grammar_of(request.body) is not None:
        return [], _bad(
            ErrorCode.invalid_structured_output,
            "answer was cut off by max_tokens before its grammar was complete",
            text,
            "response_format",
        )
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
