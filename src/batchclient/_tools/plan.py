"""Tool calling for any model: plan a body's tools, read the calls back from the answer.

:func:`plan_tools` splits an OpenAI chat-completions body into a tool-free body and a
:class:`ToolPlan`: the tools are either written into the prompt in a Llama Stack
``ToolPromptFormat`` (``batchclient._tool_formats``: for models and servers without native tool
calling) or left to a chat template that renders tools itself (``native``, inline only).
:func:`read_answer` / :func:`apply_to_body` turn the answer back into OpenAI ``tool_calls``.

A ``required`` or named ``tool_choice`` is enforced the way vLLM's OpenAI server enforces it: a
JSON schema over the call (named: the tool's parameters; required: a list of ``{"name",
"parameters"}`` objects), sent as ``response_format``, so the engine cannot answer otherwise.
``tool_choice: "none"`` offers no tools at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..types import ToolPromptFormat
from .formats import (
    ToolRefusal,
    call_entry,
    decode_json_prefix,
    history_as_text,
    json_call,
    parameters_of,
    parse_calls,
    system_prompt,
    text_of,
    with_system_prompt,
)

__all__ = [
    "DEFAULT_FORMAT",
    "NativeParser",
    "ToolPlan",
    "ToolRefusal",
    "apply_to_body",
    "forced_schema",
    "mentions_tools",
    "plan_tools",
    "read_answer",
]

DEFAULT_FORMAT = ToolPromptFormat.json
"""The format used when the caller gives none and the model cannot render tools itself."""


@dataclass(frozen=True)
class ToolPlan:
    """How one request's tools travel and how its answer is read back.

    ``choice``: ``"auto"``, ``"required"`` or a tool's name (never ``"none"``: then there is no
    plan). ``fmt``: the prompt format, or None when the chat template renders the tools
    (``native``) and a vLLM tool parser reads the calls. ``tools``: the OpenAI ``tools`` entries.
    """

    choice: str
    fmt: ToolPromptFormat | None
    tools: tuple[dict[str, Any], ...]
    parallel: bool = True

    @property
    def forced(self) -> bool:
        return self.choice != "auto"

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]


# ---------------------------------------------------------------------------- request side


def mentions_tools(body: Mapping[str, Any]) -> bool:
    """Whether a body offers tools or carries earlier tool calls or tool responses."""
    if any(body.get(k) is not None for k in ("tools", "tool_choice", "parallel_tool_calls")):
        return True
    messages = body.get("messages")
    return isinstance(messages, list) and any(
        isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls")) for m in messages
    )


def _functions(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise ToolRefusal("tools must be a list of {type: function, function: {...}}", "tools")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or not fn["name"]
        ):
            raise ToolRefusal(
                f"tools[{i}] is not a function tool {{type: function, function: {{name, ...}}}}",
                "tools",
            )
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise ToolRefusal(f"tools[{i}].function.parameters must be a JSON schema", "tools")
        out.append(tool)
    return out


def tool_choice_name(choice: Any, names: Sequence[str]) -> str:
    """An OpenAI ``tool_choice`` as ``"auto"``, ``"none"``, ``"required"`` or a tool's name."""
    if choice is None:
        return "auto" if names else "none"
    if choice in ("auto", "none", "required"):
        return str(choice)
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise ToolRefusal(
            'tool_choice must be "auto", "none", "required" or '
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if name not in names:
        raise ToolRefusal(
            f"tool_choice names {name!r}, which is not among the tools: {', '.join(names)}",
            "tool_choice",
        )
    return name


def forced_schema(plan: ToolPlan) -> dict[str, Any] | None:
    """The JSON schema a forced answer must follow (vLLM's server uses the same shapes):
    named tool -> its parameters; ``required`` -> a non-empty list of ``{"name", "parameters"}``
    (at most one when ``parallel_tool_calls`` is false); ``auto`` -> None."""
    if not plan.forced:
        return None
    if plan.choice != "required":
        tool = next(t for t in plan.tools if t["function"]["name"] == plan.choice)
        return parameters_of(tool)
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "enum": [t["function"]["name"]]},
                        "parameters": parameters_of(t),
                    },
                    "required": ["name", "parameters"],
                }
                for t in plan.tools
            ]
        },
    }
    if not plan.parallel:
        schema["maxItems"] = 1
    return schema


def plan_tools(
    body: Mapping[str, Any], fmt: ToolPromptFormat | None, *, native: bool = False
) -> tuple[dict[str, Any], ToolPlan | None]:
    """Split an OpenAI body into a tool-free body and the plan for its tools.

    ``native=False`` (the prompt formats): the tool definitions are written into the system
    message in ``fmt`` (default ``json``), assistant tool calls already in the conversation are
    written as text in the same format and tool responses become user messages (a template
    without tool support cannot render either). ``native=True``: messages are left for the chat
    template, which is given ``plan.tools``. Either way a forced choice becomes a
    ``response_format`` JSON schema (:func:`forced_schema`). Without tools, or with
    ``tool_choice: "none"``, no tools are offered and the plan is None.

    Raises:
        ToolRefusal: malformed ``tools``/``tool_choice`` (``invalid_request``), or a forced
            tool choice together with a response format (they would constrain the same answer).
    """
    out = dict(body)
    tools = _functions(out.pop("tools", None) or [])
    names = [t["function"]["name"] for t in tools]
    choice = tool_choice_name(out.pop("tool_choice", None), names)
    parallel = out.pop("parallel_tool_calls", None) is not False
    if choice != "none" and not tools:
        raise ToolRefusal(f"tool_choice {choice!r} needs tools", "tool_choice")
    fmt = None if native else ToolPromptFormat(fmt or DEFAULT_FORMAT)
    messages = out.get("messages")
    if fmt is not None and isinstance(messages, list):
        out["messages"] = history_as_text(messages, fmt)
    if choice == "none":
        return out, None
    plan = ToolPlan(choice=choice, fmt=fmt, tools=tuple(tools), parallel=parallel)
    if fmt is not None and isinstance(out.get("messages"), list):
        out["messages"] = with_system_prompt(out["messages"], system_prompt(tools, fmt))
    schema = forced_schema(plan)
    if schema is not None:
        for field in ("response_format", "structured_outputs"):
            if out.get(field) is not None:
                raise ToolRefusal(
                    f"{field} cannot be combined with tool_choice {choice!r}: both constrain "
                    "the same answer",
                    field,
                )
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "tool_call", "schema": schema},
        }
    return out, plan


NativeParser = Callable[[str], tuple[str | None, list[dict[str, Any]]]]
"""Reads calls from a natively rendered answer: text -> (content, OpenAI tool_calls)."""


def read_answer(
    plan: ToolPlan, text: str, finish_reason: str, native: NativeParser | None = None
) -> tuple[str | None, list[dict[str, Any]], str]:
    """The answer to a request planned by :func:`plan_tools`: ``(content, tool_calls,
    finish_reason)`` in OpenAI's terms (``tool_calls`` for calls from ``auto`` and
    ``required``, ``stop`` for a named tool, as OpenAI reports them)."""
    if plan.choice == "required":
        value = decode_json_prefix(text.strip())
        calls: list[dict[str, Any]] = []
        if value is not None and isinstance(value[0], list):
            for item in value[0]:
                call = json_call(item)
                calls.append(call if call is not None else call_entry("", json.dumps(item)))
        if not calls:  # not the forced shape: keep the raw text as the arguments
            calls = [call_entry(plan.names[0] if len(plan.names) == 1 else "", text)]
        return None, calls, "tool_calls" if finish_reason == "stop" else finish_reason
    if plan.forced:
        return None, [call_entry(plan.choice, text.strip())], finish_reason
    if plan.fmt is None:
        if native is None:
            return text, [], finish_reason
        content, calls = native(text)
    else:
        content, calls = parse_calls(text, plan.fmt)
    if not calls:
        return text, [], finish_reason
    return content or None, calls, "tool_calls" if finish_reason == "stop" else finish_reason


def apply_to_body(plan: ToolPlan, body: dict[str, Any], native: NativeParser | None = None) -> None:
    """Rewrite a ChatCompletion body's first choice in place with :func:`read_answer`."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        return
    content, calls, finish = read_answer(
        plan, text_of(message.get("content")), str(choice.get("finish_reason") or "stop"), native
    )
    message["content"] = content
    if calls:
        message["tool_calls"] = calls
    choice["finish_reason"] = finish
