"""The stub's normal answers to ``/v1/completions`` and ``/v1/embeddings`` bodies.

Deterministic, so tests can predict them:

- a completion echoes its prompt (``"echo: <text>"``, or the token ids as words), truncated to
  ``max_tokens`` words (16 when unset, OpenAI's default). With ``echo`` and ``logprobs`` the
  answer carries OpenAI's legacy ``logprobs`` for every prompt position: token ``t`` (its id,
  or the word) has log-probability ``-(t % 7 + 1) / 10`` and is the only, hence greedy,
  alternative, except ids divisible by 5, whose top alternative is ``"<alt>"`` at ``-0.05``;
- an embedding is an 8-dimensional unit vector derived from the input's SHA-256.
"""

from __future__ import annotations

import array
import base64
import hashlib
import json
import math
import random
import sys
import time
from typing import Any


def _words(prompt: Any) -> list[str]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt.split()
    if isinstance(prompt, list):
        return [str(t) for t in prompt]
    return []


def token_logprob(token: int) -> float:
    """The stub's log-probability of prompt token ``token`` (see the module doc)."""
    return -((token % 7) + 1) / 10


def _echo_logprobs(prompt: Any) -> dict[str, Any]:
    tokens = (
        prompt if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) else None
    )
    words = _words(prompt)
    token_logprobs: list[float | None] = []
    top: list[dict[str, float] | None] = []
    for i, word in enumerate(words):
        if i == 0:
            token_logprobs.append(None)
            top.append(None)
            continue
        t = tokens[i] if tokens is not None else sum(map(ord, word))
        lp = token_logprob(t)
        token_logprobs.append(lp)
        top.append({word: lp, "<alt>": -0.05} if t % 5 == 0 else {word: lp})
    offsets, pos = [], 0
    for word in words:
        offsets.append(pos)
        pos += len(word)
    return {
        "tokens": words,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    }


def text_completion_body(body: dict[str, Any]) -> dict[str, Any]:
    """The stub's normal answer to a completions body."""
    prompt = body.get("prompt")
    words = ["echo:", *_words(prompt)]
    max_tokens = body.get("max_tokens")
    max_tokens = 16 if max_tokens is None else max_tokens
    finish = "stop"
    if isinstance(max_tokens, int) and max_tokens < len(words):
        words, finish = words[:max_tokens], "length"
    prompt_tokens = len(_words(prompt))
    text = " ".join(words)
    logprobs = None
    if body.get("echo"):
        text = " ".join(_words(prompt)) + (" " + text if text else "")
        if body.get("logprobs") is not None:
            logprobs = _echo_logprobs(prompt)
    return {
        "id": f"cmpl-stub-{random.getrandbits(48):x}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": body.get("model", "stub"),
        "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(words),
            "total_tokens": prompt_tokens + len(words),
        },
    }


def stub_vector(value: Any) -> list[float]:
    """The stub's embedding of one input (an 8-dimensional unit vector)."""
    digest = hashlib.sha256(repr(value).encode()).digest()
    raw = [b - 127.5 for b in digest[:8]]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]


def _encode(vector: list[float], fmt: Any) -> list[float] | str:
    if fmt != "base64":
        return vector
    floats = array.array("f", vector)
    if sys.byteorder == "big":
        floats.byteswap()
    return base64.b64encode(floats.tobytes()).decode("ascii")


def embedding_body(body: dict[str, Any]) -> dict[str, Any]:
    """The stub's normal answer to an embeddings body (one entry per input)."""
    raw = body.get("input")
    inputs = raw if isinstance(raw, list) and raw and isinstance(raw[0], str | list) else [raw]
    fmt = body.get("encoding_format")
    tokens = sum(len(_words(i)) for i in inputs)
    return {
        "object": "list",
        "model": body.get("model", "stub"),
        "data": [
            {"object": "embedding", "index": i, "embedding": _encode(stub_vector(v), fmt)}
            for i, v in enumerate(inputs)
        ],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _input_text(value: Any) -> str:
    """A Responses request's last user turn as text (``input`` text, or the last user message
    item's text and ``input_text`` parts)."""
    if isinstance(value, str):
        return value
    for item in reversed(value if isinstance(value, list) else []):
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            parts = content if isinstance(content, list) else []
            return " ".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
    return ""


def responses_body(body: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """The stub's normal answer to a ``/v1/responses`` body: a ``Response`` whose one message
    echoes the last user turn, cut (``status`` ``incomplete``) at ``max_output_tokens``
    words."""
    text = _input_text(body.get("input"))
    words = f"echo: {text}".split()
    limit = body.get("max_output_tokens")
    cut = False
    if isinstance(limit, int) and limit < len(words):
        words, cut = words[:limit], True
    prompt = len(f"{body.get('instructions') or ''} {json.dumps(body.get('input'))}".split())
    rid = f"{random.getrandbits(48):x}"
    return {
        "id": f"resp_stub{rid}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": model or body.get("model", "stub"),
        "instructions": body.get("instructions"),
        "output": [
            {"type": "message", "id": f"msg_stub{rid}", "role": "assistant",
             "status": "completed",
             "content": [{"type": "output_text", "text": " ".join(words), "annotations": []}]}
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": len(words), "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + len(words),
        },
    }  # fmt: skip


_CATEGORIES = (
    "harassment", "harassment/threatening", "hate", "hate/threatening", "illicit",
    "illicit/violent", "self-harm", "self-harm/instructions", "self-harm/intent", "sexual",
    "sexual/minors", "violence", "violence/graphic",
)  # fmt: skip
"""The categories of OpenAI's ``omni-moderation`` models (every one the SDK's type needs)."""


def moderation_body(body: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """The stub's normal answer to a ``/v1/moderations`` body: one result per input text,
    flagged (``violence``) when the text contains ``FLAG``; each text's ``harassment`` score is
    its word count / 1,000 (capped at 1), so an answer can be told from another's."""
    value = body.get("input")
    texts = [value] if isinstance(value, str) else list(value or [])
    results = []
    for text in texts:
        text = text if isinstance(text, str) else json.dumps(text)
        flagged = "FLAG" in text
        scores = dict.fromkeys(_CATEGORIES, 0.0)
        scores["harassment"] = min(1.0, len(text.split()) / 1000)
        scores["violence"] = 0.99 if flagged else 0.0
        categories = {name: name == "violence" and flagged for name in _CATEGORIES}
        results.append(
            {"flagged": flagged, "categories": categories, "category_scores": scores,
             "category_applied_input_types": {name: ["text"] for name in _CATEGORIES}}
        )  # fmt: skip
    return {
        "id": f"modr-stub{random.getrandbits(48):x}",
        "model": model or body.get("model", "stub"),
        "results": results,
    }
