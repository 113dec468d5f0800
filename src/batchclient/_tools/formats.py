"""Tool calling written into the prompt, for models and servers without native tool calling.

Llama Stack's ``ToolPromptFormat`` (``llama_models/llama3/prompt_templates/system_prompts.py``):

- ``json``: definitions as OpenAI-style function objects; a call is
  ``{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}``.
- ``function_tag``: a call is ``<function=get_weather>{"city": "Paris"}</function>``.
- ``python_list``: a call is ``[get_weather(city="Paris")]``.

Each format is parsed only as itself. Everything here works on OpenAI wire forms (``tools[]``
entries, messages, ``tool_calls``); ``batchclient._tools`` decides when it is used. Where and
why this differs from Llama Stack: ``docs/structured.md`` ("Tools").
"""

from __future__ import annotations

import ast
import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ErrorCode
from ..types import ToolPromptFormat


class ToolRefusal(Exception):
    """The body's tools or tool choice cannot be served: ``code`` (an ``ErrorCode``) and
    ``param`` name what is wrong."""

    def __init__(self, message: str, param: str, code: ErrorCode = ErrorCode.invalid_request):
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


def parameters_of(tool: Mapping[str, Any]) -> dict[str, Any]:
    params = tool["function"].get("parameters")
    return params if isinstance(params, dict) else {"type": "object", "properties": {}}


def _definition(tool: Mapping[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    return {
        "name": fn["name"],
        "description": fn.get("description") or "",
        "parameters": parameters_of(tool),
    }


def system_prompt(tools: Sequence[Mapping[str, Any]], fmt: ToolPromptFormat) -> str:
    """The tool instructions for the system message, in Llama Stack's wording for ``fmt``."""
    defs = [_definition(t) for t in tools]
    if fmt == ToolPromptFormat.json:
        listed = "\n".join(json.dumps({"type": "function", "function": d}) for d in defs)
        return (
            "Answer the user's question by making use of the following functions if needed.\n"
            "If none of the function can be used, please say so.\n"
            "Here is a list of functions in JSON format:\n"
            f"{listed}\n"
            "Return function calls in JSON format: "
            '{"type": "function", "name": "function_name", "parameters": {...}}'
        )
    if fmt == ToolPromptFormat.function_tag:
        listed = "".join(
            f"Use the function '{d['name']}' to '{d['description']}':\n{json.dumps(d)}\n\n"
            for d in defs
        )
        return (
            "You have access to the following functions:\n\n"
            f"{listed}"
            "Think very carefully before calling functions.\n"
            "If you choose to call a function ONLY reply in the following format with no prefix "
            "or suffix:\n\n"
            '<function=example_function_name>{"example_name": "example_value"}</function>\n\n'
            "Reminder:\n"
            "- Function calls MUST follow the specified format, start with <function= and end "
            "with </function>\n"
            "- Required parameters MUST be specified\n"
            "- Only call one function at a time\n"
            "- Put the entire function call reply on one line"
        )
    listed = json.dumps(defs, indent=4)
    return (
        "You are an expert in composing functions. You are given a question and a set of "
        "possible functions.\n"
        "Based on the question, you will need to make one or more function/tool calls to "
        "achieve the purpose.\n"
        "If none of the function can be used, point it out. If the given question lacks the "
        "parameters required by the function,\n"
        "also point it out. You should only return the function call in tools call sections.\n\n"
        "If you decide to invoke any of the function(s), you MUST put it in the format of "
        "[func_name1(params_name1=params_value1, params_name2=params_value2...), "
        "func_name2(params)]\n"
        "You SHOULD NOT include any other text in the response.\n\n"
        "Here is a list of functions in JSON format that you can invoke.\n\n"
        f"{listed}"
    )


def with_system_prompt(messages: list[Any], prompt: str) -> list[Any]:
    """``prompt`` as the system message, after the conversation's own system text if any."""
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer"):
        own = text_of(first.get("content"))
        merged = {"role": "system", "content": f"{own}\n\n{prompt}" if own else prompt}
        return [merged, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return str(content)


def _python_value(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_python_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{json.dumps(str(k))}: {_python_value(v)}" for k, v in value.items())
            + "}"
        )
    return json.dumps(str(value))


def encode_calls(calls: Sequence[tuple[str, dict[str, Any]]], fmt: ToolPromptFormat) -> str:
    """Tool calls as the model would have written them in ``fmt`` (for conversation history)."""
    if fmt == ToolPromptFormat.python_list:
        inner = ", ".join(
            f"{name}({', '.join(f'{k}={_python_value(v)}' for k, v in args.items())})"
            for name, args in calls
        )
        return f"[{inner}]"
    if fmt == ToolPromptFormat.function_tag:
        return "\n".join(f"<function={name}>{json.dumps(args)}</function>" for name, args in calls)
    return "\n".join(
        json.dumps({"type": "function", "name": name, "parameters": args}) for name, args in calls
    )


def history_as_text(messages: list[Any], fmt: ToolPromptFormat) -> list[Any]:
    """Assistant tool calls -> assistant text in ``fmt``; tool responses -> one user message
    per run of consecutive responses (``Tool response for NAME: CONTENT``), so any chat
    template can render the conversation and roles keep alternating."""
    names: dict[str, str] = {}
    out: list[Any] = []
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        role = message.get("role")
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls:
            decoded = []
            for call in calls:
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict):
                    raise ToolRefusal("an assistant tool call has no function", "messages")
                raw = fn.get("arguments")
                try:
                    args = json.loads(raw) if isinstance(raw, str) and raw else (raw or {})
                except ValueError:
                    raise ToolRefusal(
                        f"arguments of the earlier call to {fn.get('name')!r} are not JSON",
                        "messages",
                    ) from None
                names[str(call.get("id"))] = str(fn.get("name"))
                decoded.append((str(fn.get("name")), args if isinstance(args, dict) else {}))
            text = text_of(message.get("content"))
            encoded = encode_calls(decoded, fmt)
            out.append({"role": "assistant", "content": f"{text}\n{encoded}" if text else encoded})
        elif role == "tool":
            name = names.get(str(message.get("tool_call_id")), "the tool")
            line = f"Tool response for {name}: {text_of(message.get('content'))}"
            previous = out[-1] if out else None
            if isinstance(previous, dict) and previous.get("_tool_response"):
                previous["content"] += "\n" + line
            else:
                out.append({"role": "user", "content": line, "_tool_response": True})
        elif role == "assistant" and message.get("content") is None:
            out.append({**message, "content": ""})  # templates concatenate content as text
        else:
            out.append(message)
    for message in out:
        if isinstance(message, dict):
            message.pop("_tool_response", None)
    return out


def call_entry(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"call_{secrets.token_hex(12)}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def decode_json_prefix(text: str) -> tuple[Any, int] | None:
    try:
        return json.JSONDecoder().raw_decode(text)
    except ValueError:
        return None


def _strip_fence(text: str) -> str:
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0]
    return body.strip()


def parse_calls(text: str, fmt: ToolPromptFormat) -> tuple[str, list[dict[str, Any]]]:
    """The tool calls written in ``text`` in format ``fmt``, as OpenAI ``tool_calls`` entries,
    and the text before them. No call: ``(text, [])``. A call whose arguments cannot be read
    keeps them as written, so the answer check reports it (``invalid_tool_call``) with the raw
    text instead of passing it off as prose."""
    if fmt == ToolPromptFormat.function_tag:
        return _parse_function_tags(text)
    if fmt == ToolPromptFormat.python_list:
        return _parse_python_list(text)
    return _parse_json_calls(text)


def _parse_function_tags(text: str) -> tuple[str, list[dict[str, Any]]]:
    tag = "<function="
    start = text.find(tag)
    if start < 0:
        return text, []
    content, calls, pos = text[:start].strip(), [], start
    while pos >= 0:
        name_end = text.find(">", pos)
        if name_end < 0:
            calls.append(call_entry("", text[pos:]))
            break
        name = text[pos + len(tag) : name_end].strip()
        rest = text[name_end + 1 :]
        decoded = decode_json_prefix(rest)
        close = rest.find("</function>")
        if decoded is not None and isinstance(decoded[0], dict):
            calls.append(call_entry(name, json.dumps(decoded[0])))
        else:
            calls.append(call_entry(name, rest if close < 0 else rest[:close]))
        pos = text.find(tag, name_end)
    return content, calls


def json_call(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    if "parameters" in value:
        args = value["parameters"]
    elif "arguments" in value:
        args = value["arguments"]
    else:
        return None
    return call_entry(value["name"], args if isinstance(args, str) else json.dumps(args))


def _parse_json_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    body = _strip_fence(text)
    decoded = decode_json_prefix(body)
    if decoded is None:
        return text, []
    value = decoded[0]
    items = value if isinstance(value, list) else [value]
    calls = [json_call(v) for v in items]
    if not items or any(c is None for c in calls):
        return text, []
    return "", [c for c in calls if c is not None]


def _parse_python_list(text: str) -> tuple[str, list[dict[str, Any]]]:
    body = _strip_fence(text)
    if not (body.startswith("[") and body.endswith("]")):
        return text, []
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError:
        return text, []
    if not isinstance(tree, ast.List) or not tree.elts:
        return text, []
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            return text, []
        args: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                return text, []
            try:
                args[kw.arg] = ast.literal_eval(kw.value)
            except ValueError:
                # not a literal (e.g. a bare name): keep the source so the check shows it
                calls.append(call_entry(node.func.id, ast.get_source_segment(body, node) or body))
                break
        else:
            if node.args:
                calls.append(call_entry(node.func.id, ast.get_source_segment(body, node) or body))
            else:
                calls.append(call_entry(node.func.id, json.dumps(args)))
    return "", calls
