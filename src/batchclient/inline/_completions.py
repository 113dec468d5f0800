"""OpenAI ``/v1/completions`` and ``/v1/embeddings`` bodies <-> what the vLLM engine takes and
gives. Pure functions (no vLLM import), like :mod:`._mapping` for chat.

Request side: every field is honoured or refused with ``unsupported_parameter`` naming it.
Completions follow vLLM's OpenAI server (``vllm/entrypoints/openai/completion/protocol.py``):
``max_tokens`` defaults to 16; ``echo`` with ``max_tokens: 0`` returns the prompt alone (one
token is generated and dropped); ``echo`` with ``logprobs`` asks for the prompt's
log-probabilities too; ``prompt_logprobs`` (vLLM's field) asks for them by token id.

Response side: the ``Completion`` (``object: "text_completion"``) and
``CreateEmbeddingResponse`` (``object: "list"``) objects in the shapes vLLM's server writes,
so job output files look the same whichever provider wrote them.
"""

from __future__ import annotations

import array
import base64
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._core.decode import clamp_logprob
from ..errors import ErrorCode
from ._mapping import (
    _FLOAT_EXTRAS,
    _FLOATS,
    _INTS,
    _OPENAI_DEFAULTS,
    Refusal,
    _check_no_streaming,
    _flag,
    _integer,
    _invalid,
    _logit_bias,
    _number,
    _structured,
    _unsupported,
)

DEFAULT_MAX_TOKENS = 16
"""``max_tokens`` of a completion that does not set it (OpenAI's and vLLM's default)."""

_COMPLETION_FIELDS = frozenset(
    {
        "model",
        "user",
        "prompt",
        *_FLOATS,
        *_FLOAT_EXTRAS,
        *_INTS,
        "max_tokens",
        "stop",
        "seed",
        "n",
        "stream",
        "stream_options",
        "echo",
        "logprobs",
        "prompt_logprobs",
        "logit_bias",
        "ignore_eos",
        "response_format",
        "structured_outputs",
        "add_special_tokens",
    }
)
_EMBEDDING_FIELDS = frozenset(
    {"model", "user", "input", "encoding_format", "dimensions", "add_special_tokens"}
)

Prompt = str | list[int]


@dataclass
class CompletionPlan:
    """What one completions body asks the engine for: ``prompt`` (text or token ids),
    ``sampling`` (``vllm.SamplingParams`` keyword arguments, ``max_tokens`` and
    ``structured_outputs`` aside), the ``max_tokens`` to generate and whether the output is
    dropped (``echo`` with ``max_tokens: 0``), and what to report."""

    prompt: Prompt
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int = DEFAULT_MAX_TOKENS
    drop_output: bool = False
    echo: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    structured: dict[str, Any] | None = None
    add_special_tokens: bool = True


def _one_prompt(value: Any, name: str) -> Prompt:
    """A single prompt: text, token ids, or a one-element list of either (OpenAI accepts a
    list of prompts; a batch line carries one)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    ):
        return list(value)
    if isinstance(value, list) and len(value) > 1 and all(isinstance(v, str | list) for v in value):
        raise _unsupported(name, "one prompt per request (give each its own batch line)")
    raise _invalid(name, "expected text, a list of token ids, or a one-element list of either")


def _check_fields(body: Mapping[str, Any], allowed: frozenset[str], kind: str) -> None:
    for name in body:
        if name not in allowed:
            raise _unsupported(name, f"not a {kind} field this engine can honour")


def map_completion_body(
    body: Mapping[str, Any], model_defaults: Mapping[str, Any] | None = None
) -> CompletionPlan:
    """Check a completions body and map it to engine inputs (sampling as for chat: the
    caller's value, else the model's generation config, else OpenAI's default).

    Raises:
        Refusal: ``unsupported_parameter`` (``stream``, ``n`` > 1, several prompts, unknown
            fields), ``invalid_request`` (a value of the wrong type).
    """
    defaults = dict(model_defaults or {})
    _check_fields(body, _COMPLETION_FIELDS, "completions")
    if "prompt" not in body:
        raise _invalid("prompt", "a completions body needs a prompt")
    _check_no_streaming(body)
    n = _integer(body, "n")
    if n is not None and n != 1:
        raise _unsupported("n", f"one choice per request only (got n={n})")
    plan = CompletionPlan(prompt=_one_prompt(body["prompt"], "prompt"))
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
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise _invalid("stop", "expected a string or a list of strings")
        sampling["stop"] = stop
    if _flag(body, "ignore_eos"):
        sampling["ignore_eos"] = True
    sampling.update(_logit_bias(body))
    plan.add_special_tokens = _flag(body, "add_special_tokens") is not False

    plan.echo = bool(_flag(body, "echo"))
    max_tokens = _integer(body, "max_tokens")
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if max_tokens == 0 and plan.echo:
        plan.drop_output, max_tokens = True, 1
    plan.max_tokens = max_tokens
    plan.logprobs = _integer(body, "logprobs")
    if plan.logprobs is not None:
        sampling["logprobs"] = plan.logprobs
    plan.prompt_logprobs = _integer(body, "prompt_logprobs")
    wanted = plan.prompt_logprobs
    if wanted is None and plan.echo and plan.logprobs is not None:
        wanted = plan.logprobs  # echoed log-probabilities need the prompt's (as vLLM)
    if wanted is not None:
        sampling["prompt_logprobs"] = wanted
    plan.structured = _structured(body)
    return plan


@dataclass
class EmbeddingPlan:
    """What one embeddings body asks for: its inputs (text or token ids), ``dimensions``
    (None: the model's) and the encoding of the answer."""

    inputs: list[Prompt]
    encoding_format: str = "float"
    dimensions: int | None = None
    add_special_tokens: bool = True


def map_embedding_body(body: Mapping[str, Any]) -> EmbeddingPlan:
    """Check an embeddings body. ``input`` is text, token ids, or a list of either (one
    embedding each). Raises ``Refusal`` as :func:`map_completion_body`."""
    _check_fields(body, _EMBEDDING_FIELDS, "embeddings")
    raw = body.get("input")
    if raw is None:
        raise _invalid("input", "an embeddings body needs an input")
    if isinstance(raw, list) and raw and all(isinstance(v, str | list) for v in raw):
        inputs = [_one_prompt(v, "input") for v in raw]
    else:
        inputs = [_one_prompt(raw, "input")]
    if any(p == "" for p in inputs):
        raise _invalid("input", "an input is empty")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise _unsupported("encoding_format", f"{fmt!r} (use float or base64)")
    dimensions = _integer(body, "dimensions")
    if dimensions is not None and dimensions < 1:
        raise _invalid("dimensions", "must be >= 1")
    return EmbeddingPlan(
        inputs=inputs,
        encoding_format=str(fmt),
        dimensions=dimensions,
        add_special_tokens=_flag(body, "add_special_tokens") is not False,
    )


def check_prompt_length(prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    """Refuse a prompt that, with ``max_tokens`` more, does not fit ``max_model_len``
    (``context_length_exceeded``; never shortened)."""
    if prompt_tokens + max_tokens > max_model_len:
        raise Refusal(
            ErrorCode.context_length_exceeded,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
            f"{max_tokens} for the completion). Please reduce the length of the prompt.",
            param="prompt",
        )


# ---------------------------------------------------------------------------- response side

Decode = Callable[[int], str]


def _decoded(step: Mapping[int, Any], token_id: int, decode: Decode) -> str:
    lp = step.get(token_id)
    text = getattr(lp, "decoded_token", None)
    return text if isinstance(text, str) else decode(token_id)


def legacy_logprobs(
    token_ids: Sequence[int],
    steps: Sequence[Mapping[int, Any] | None],
    top: int,
    decode: Decode,
    offset: int = 0,
) -> dict[str, Any]:
    """OpenAI's legacy completions ``logprobs`` (``tokens``, ``token_logprobs``,
    ``top_logprobs``, ``text_offset``) from vLLM's per-position ``{token id: Logprob}`` maps,
    as vLLM's server writes them (a position without a map, the first prompt token, is
    ``None``; ``top_logprobs`` has the token and its ``top`` best alternatives)."""
    out: dict[str, list[Any]] = {
        "text_offset": [],
        "token_logprobs": [],
        "tokens": [],
        "top_logprobs": [],
    }
    position = offset
    for i, token_id in enumerate(token_ids):
        step = steps[i] if i < len(steps) else None
        if step is None:
            token = decode(token_id)
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
        else:
            token = _decoded(step, token_id, decode)
            chosen = step.get(token_id)
            out["token_logprobs"].append(
                clamp_logprob(float(chosen.logprob)) if chosen is not None else None
            )
            ranked = sorted(step.items(), key=lambda kv: getattr(kv[1], "rank", None) or 1 << 30)
            alternatives = {
                _decoded(step, tid, decode): clamp_logprob(float(lp.logprob))
                for tid, lp in ranked[:top]
            }
            if chosen is not None:
                alternatives.setdefault(token, clamp_logprob(float(chosen.logprob)))
            out["top_logprobs"].append(alternatives)
        out["tokens"].append(token)
        out["text_offset"].append(position)
        position += len(token)
    return out


def prompt_logprobs_json(
    steps: Sequence[Mapping[int, Any] | None], decode: Decode | None
) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs`` field: per prompt position None or ``{token id (text):
    {"logprob", "rank", "decoded_token"}}`` (without ``decoded_token`` when ``decode`` is
    None)."""
    out: list[dict[str, Any] | None] = []
    for step in steps:
        if step is None:
            out.append(None)
            continue
        entry: dict[str, Any] = {}
        for tid, lp in step.items():
            item = {"logprob": clamp_logprob(float(lp.logprob)), "rank": getattr(lp, "rank", None)}
            if decode is not None:
                item["decoded_token"] = _decoded(step, tid, decode)
            entry[str(tid)] = item
        out.append(entry)
    return out


def next_token_prompt_logprobs(
    context_tokens: int, token: int, logprob: float, greedy: int, greedy_logprob: float
) -> list[dict[str, Any] | None]:
    """The ``prompt_logprobs`` a scoring request of one continuation token would get, from a
    generation request over the context alone: None for each of the ``context_tokens``
    positions (nothing was asked for them), then ``{token id (text): {"logprob", "rank"}}``
    for the continuation ``token`` and the ``greedy`` (sampled at temperature 0) token, as
    ``prompt_logprobs: 1`` gives them. Ranks: 1 for the greedy token (and for ``token`` when
    it scores as high), else None (the engine ranks the sampled token only)."""
    lp, best = clamp_logprob(logprob), clamp_logprob(greedy_logprob)
    entry: dict[str, Any] = {str(greedy): {"logprob": best, "rank": 1}}
    entry[str(token)] = {"logprob": lp, "rank": 1 if lp >= best else None}
    return [*([None] * context_tokens), entry]


def forced_prompt_logprobs(
    context_tokens: int, steps: Sequence[tuple[int, float, int]]
) -> list[dict[str, Any] | None]:
    """The ``prompt_logprobs`` of a continuation scored by teacher forcing: None for each of
    the ``context_tokens`` positions, then per ``(token, logprob, rank)`` step
    ``{token id (text): {"logprob", "rank"}}``, the rank as vLLM computes it for a sampled
    token (1 + how many tokens have a higher log-probability; 1 is greedy), as
    ``prompt_logprobs`` rank a prompt token."""
    out: list[dict[str, Any] | None] = [None] * context_tokens
    for token, logprob, rank in steps:
        out.append({str(token): {"logprob": clamp_logprob(logprob), "rank": rank}})
    return out


def completion_object(
    *,
    request_id: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str | None,
    prompt_tokens: int,
    completion_tokens: int,
    logprobs: dict[str, Any] | None,
    prompt_logprobs: list[dict[str, Any] | None] | None,
) -> dict[str, Any]:
    """An OpenAI ``Completion`` object (``object: "text_completion"``) with one choice."""
    choice: dict[str, Any] = {
        "index": 0,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason or "stop",
    }
    if prompt_logprobs is not None:
        choice["prompt_logprobs"] = prompt_logprobs
    return {
        "id": f"cmpl-{request_id}",
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def encode_vector(vector: Sequence[float], encoding_format: str) -> list[float] | str:
    """An embedding as floats, or as OpenAI's base64 (little-endian float32)."""
    if encoding_format != "base64":
        return [float(v) for v in vector]
    floats = array.array("f", vector)
    if sys.byteorder == "big":
        floats.byteswap()
    return base64.b64encode(floats.tobytes()).decode("ascii")


def embedding_object(
    *, request_id: str, model: str, created: int, vectors: list[list[float] | str], tokens: int
) -> dict[str, Any]:
    """An OpenAI ``CreateEmbeddingResponse`` (``object: "list"``), one entry per input."""
    return {
        "id": f"embd-{request_id}",
        "object": "list",
        "created": created,
        "model": model,
        "data": [
            {"object": "embedding", "index": i, "embedding": vector}
            for i, vector in enumerate(vectors)
        ],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
