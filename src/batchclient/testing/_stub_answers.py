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
