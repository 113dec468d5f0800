"""OpenAI chat-completions bodies <-> what the vLLM engine takes and gives. Pure functions: no
vLLM import, so the rules can be read and tested on their own.

Request side (:func:`map_body`): every field of the body is either honoured or refused with an
``unsupported_parameter`` error naming it, never dropped silently (vllm #50026: ``stream`` and
``tools`` ignored). Sampling fields map the way vLLM's own OpenAI server maps them
(``vllm/entrypoints/openai/chat_completion/protocol.py``, ``ChatCompletionRequest
.to_sampling_params``): the caller's value, else the model's generation-config default, else the
OpenAI default (temperature 1, top_p 1). Temperature 0 is greedy decoding.

Response side (:func:`completion_body`): a ChatCompletion object in the OpenAI shape, so job
output files look the same whichever provider wrote them; log-probabilities below -9999 (or
``-inf``/NaN) are clamped to -9999.0 as OpenAI does (``_core.decode.clamp_logprob``). Guide:
``docs/inline.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._core.decode import clamp_logprob
from ..errors import ErrorCode

# Fields of the body that change nothing the engine does, accepted as they are.
_NO_EFFECT = frozenset({"model", "user"})
# OpenAI sampling fields and the vLLM server's extras that map one to one onto SamplingParams.
_FLOATS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty")
_FLOAT_EXTRAS = ("repetition_penalty",)
_INTS = ("top_k", "min_tokens")
# Used when neither the caller nor the model's generation config sets them (OpenAI defaults,
# as in vLLM's ChatCompletionRequest._DEFAULT_SAMPLING_PARAMS).
_OPENAI_DEFAULTS: dict[str, Any] = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
}
_STRUCTURED_KEYS = frozenset({"json", "regex", "choice", "grammar", "json_object"})
_HANDLED = frozenset(
    {
        *_NO_EFFECT,
        *_FLOATS,
        *_FLOAT_EXTRAS,
        *_INTS,
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "n",
        "stream",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "response_format",
        "structured_outputs",
        "ignore_eos",
        "logit_bias",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "chat_template",
    }
)


class Refusal(Exception):
    """The request cannot be served as given: ``code`` (an ``ErrorCode``), ``param``."""

    def __init__(self, code: ErrorCode, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


def _unsupported(name: str, why: str) -> Refusal:
    return Refusal(
        ErrorCode.unsupported_parameter, f"unsupported parameter {name!r}: {why}", param=name
    )


def _invalid(name: str, why: str) -> Refusal:
    return Refusal(ErrorCode.invalid_request, f"invalid {name!r}: {why}", param=name)


@dataclass
class Plan:
    """What one body asks the engine for.

    ``sampling`` holds ``vllm.SamplingParams`` keyword arguments except ``max_tokens`` (which
    needs the prompt length, see :func:`resolve_max_tokens`) and ``structured_outputs``
    (``structured`` holds the ``StructuredOutputsParams`` keyword arguments, or None).
    ``top_logprobs`` is the number of alternatives per token to report when log-probabilities
    were asked for, else None.
    """

    messages: list[Any]
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    structured: dict[str, Any] | None = None
    top_logprobs: int | None = None
    chat_template: str | None = None


def _number(body: Mapping[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _invalid(name, f"expected a number, got {value!r}")
    return float(value)


def _integer(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(name, f"expected an integer, got {value!r}")
    return value


def _flag(body: Mapping[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is None or isinstance(value, bool):
        return value
    raise _invalid(name, f"expected true or false, got {value!r}")


def map_body(body: Mapping[str, Any], model_defaults: Mapping[str, Any] | None = None) -> Plan:
    """Check an OpenAI chat-completions body and map it to engine inputs.

    Args:
        body: the request body (``model``, ``messages``, sampling fields, ...).
        model_defaults: the model's generation-config defaults (vLLM's
            ``ModelConfig.get_diff_sampling_param()``), used for unset sampling fields.

    Raises:
        Refusal: ``unsupported_parameter`` for a field the engine cannot honour (``stream:
            true``, ``n`` > 1, any unknown field; ``tools`` too, which the client turns into
            prompt text or template input before mapping, see ``batchclient._tools``),
            ``invalid_request`` for a value of the wrong type or shape. Range checks (e.g.
            ``max_tokens: -5``) are left to ``vllm.SamplingParams``, whose message the caller
            reports.
    """
    defaults = dict(model_defaults or {})
    for name in body:
        if name not in _HANDLED:
            raise _unsupported(name, "not a chat-completions field this engine can honour")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "expected a non-empty list of messages")
    _check_no_streaming(body)
    _check_no_tools(body)
    n = _integer(body, "n")
    if n is not None and n != 1:
        raise _unsupported("n", f"one choice per request only (got n={n})")

    plan = Plan(messages=messages)
    template = body.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise _invalid("chat_template", "expected a Jinja chat template as a string")
    plan.chat_template = template
    sampling = plan.sampling
    for name in (*_FLOATS, *_FLOAT_EXTRAS):
        value = _number(body, name)
        sampling[name] = value if value is not None else defaults.get(name, _OPENAI_DEFAULTS[name])
    for name in _INTS:
        value = _integer(body, name)
        if value is not None:
            sampling[name] = value
        elif name in _OPENAI_DEFAULTS:
            sampling[name] = defaults.get(name, _OPENAI_DEFAULTS[name])
    seed = _integer(body, "seed")
    if seed is not None:
        sampling["seed"] = seed
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _invalid("stop", "expected a string or a list of strings")
        sampling["stop"] = stop
    if _flag(body, "ignore_eos"):
        sampling["ignore_eos"] = True
    sampling.update(_logit_bias(body))

    max_tokens = _integer(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens")
    plan.max_tokens = max_tokens if max_tokens is not None else defaults.get("max_tokens")

    want_logprobs = _flag(body, "logprobs")
    top = _integer(body, "top_logprobs")
    if top is not None and not want_logprobs:
        raise _invalid("top_logprobs", "requires logprobs: true")
    if want_logprobs:
        plan.top_logprobs = top or 0
        sampling["logprobs"] = plan.top_logprobs

    plan.structured = _structured(body)
    return plan


def _check_no_streaming(body: Mapping[str, Any]) -> None:
    if _flag(body, "stream"):
        raise _unsupported("stream", "a batch answer is returned whole; use stream: false")
    if body.get("stream_options") is not None:
        raise _unsupported("stream_options", "only with stream: true, which is not supported")


def _check_no_tools(body: Mapping[str, Any]) -> None:
    # The client plans tools (batchclient._tools.plan_tools) before mapping; a body that still
    # has them here was not planned, and answering without the tools would drop them silently
    # (vllm #50026). Without tools, tool_choice "none"/"auto" and parallel_tool_calls change
    # nothing and are accepted.
    tools = body.get("tools")
    if tools:
        raise _unsupported("tools", "tools must be planned into the prompt before mapping")
    choice = body.get("tool_choice")
    if choice not in (None, "none", "auto"):
        raise _unsupported("tool_choice", "tools must be planned into the prompt before mapping")


def _logit_bias(body: Mapping[str, Any]) -> dict[str, Any]:
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise _invalid("logit_bias", "expected an object {token id: bias}")
    try:
        return {"logit_bias": {int(k): float(v) for k, v in bias.items()}}
    except (TypeError, ValueError):
        raise _invalid("logit_bias", "keys must be token ids and values numbers") from None


def _structured(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``response_format`` (OpenAI) or ``structured_outputs`` (vLLM) -> StructuredOutputsParams
    keyword arguments."""
    fmt = body.get("response_format")
    extra = body.get("structured_outputs")
    if fmt is not None and extra is not None:
        raise _invalid("structured_outputs", "give either response_format or structured_outputs")
    if extra is not None:
        if not isinstance(extra, dict) or len(extra) != 1 or not set(extra) <= _STRUCTURED_KEYS:
            raise _invalid(
                "structured_outputs",
                f"expected exactly one of {sorted(_STRUCTURED_KEYS)}, got {extra!r}",
            )
        return dict(extra)
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise _invalid("response_format", "json_schema.schema must be a JSON schema object")
        return {"json": schema}
    raise _unsupported("response_format", f"type {kind!r} (use text, json_object or json_schema)")


def resolve_max_tokens(requested: int | None, prompt_tokens: int, max_model_len: int) -> int:
    """The ``max_tokens`` to give the engine: as requested, or up to the context when unset.

    Raises:
        Refusal: ``context_length_exceeded`` when the prompt leaves no room for output, or
            prompt + ``max_tokens`` is over ``max_model_len`` (the prompt is never truncated;
            vllm #1655, #16732). Non-positive ``max_tokens`` is left to SamplingParams to refuse.
    """
    room = max_model_len - prompt_tokens
    if room <= 0:
        raise Refusal(
            ErrorCode.context_length_exceeded,
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"messages resulted in {prompt_tokens} tokens, which leaves no room for output. "
            "Please reduce the length of the messages.",
            param="messages",
        )
    if requested is None:
        return room
    if requested > room:
        raise Refusal(
            ErrorCode.context_length_exceeded,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + requested} tokens ({prompt_tokens} in the messages, "
            f"{requested} in the completion). Please reduce the length of the messages or "
            "completion.",
            param="max_tokens",
        )
    return requested


# ---------------------------------------------------------------------------- response side


def _entry(token: str, logprob: Any) -> dict[str, Any]:
    return {
        "token": token,
        "logprob": clamp_logprob(logprob),
        "bytes": list(token.encode("utf-8", errors="replace")),
    }


def _rank(logprob: Any) -> int:
    rank = getattr(logprob, "rank", None)
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0 else 1 << 30


def logprobs_content(
    token_ids: Sequence[int],
    steps: Sequence[Mapping[int, Any] | None],
    top_logprobs: int,
    decode: Callable[[int], str],
) -> list[dict[str, Any]]:
    """OpenAI ``choices[0].logprobs.content`` from vLLM's per-token ``{token id: Logprob}``
    maps (``Logprob`` has ``logprob``, 1-based ``rank`` and ``decoded_token``).

    Each generated token gets its own log-probability and its ``top_logprobs`` best
    alternatives by rank (the sampled token among them when it ranks that high).
    """
    content: list[dict[str, Any]] = []
    for token_id, step in zip(token_ids, steps, strict=False):
        step = step or {}

        def text(tid: int, lp: Any) -> str:
            decoded = getattr(lp, "decoded_token", None)
            return decoded if isinstance(decoded, str) else decode(tid)

        chosen = step.get(token_id)
        entry = _entry(
            text(token_id, chosen) if chosen is not None else decode(token_id),
            getattr(chosen, "logprob", None),
        )
        ranked = sorted(step.items(), key=lambda item: _rank(item[1]))
        entry["top_logprobs"] = [
            _entry(text(tid, lp), getattr(lp, "logprob", None)) for tid, lp in ranked[:top_logprobs]
        ]
        content.append(entry)
    return content


def completion_body(
    *,
    request_id: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    logprobs: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """An OpenAI ``ChatCompletion`` object (``object: "chat.completion"``) with one choice."""
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": {"content": logprobs} if logprobs is not None else None,
                "finish_reason": finish_reason or "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
