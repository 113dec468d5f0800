"""The benchmark's requests: ShareGPT V3 sampled by vLLM's rules, or an OpenAI batch JSONL file.

Every mode gets the same list, in the same order, with the same ``max_tokens`` per request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import ConfigurationError
from ._spec import BenchRequest


def sharegpt_requests(n: int, *, seed: int, max_tokens: int) -> list[BenchRequest]:
    """``n`` ShareGPT conversations (:func:`batchclient.datasets.sample_sharegpt`: first human
    turn as the prompt, prompts of 4-1,024 tokens, fixed ``seed``); ``max_tokens`` of each is
    the reference reply's length in tokens, capped at ``max_tokens``."""
    from ...datasets import sample_sharegpt

    samples = sample_sharegpt(n, seed=seed, max_output_tokens=max_tokens)
    return [
        BenchRequest(custom_id=f"sharegpt-{s.id}", messages=s.messages, max_tokens=s.output_tokens)
        for s in samples
    ]


def jsonl_requests(path: Path, *, n: int | None, max_tokens: int) -> list[BenchRequest]:
    """The requests of an OpenAI batch input file (one JSON object a line with ``custom_id``
    and ``body.messages``): ``max_tokens`` is the line's ``body.max_tokens`` (or
    ``max_completion_tokens``) capped at ``max_tokens``, or ``max_tokens`` when the line sets
    none. Other body fields (model, temperature, ...) are not used: every mode samples
    greedily, so all of them generate the same thing. ``n`` keeps only the first ``n`` lines.

    Raises:
        ConfigurationError: the file cannot be read, or a line is not JSON or has no
            ``body.messages`` list (the message names the line): a benchmark whose requests
            cannot all be sent by every mode would not compare like with like.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc}") from exc
    requests: list[BenchRequest] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if n is not None and len(requests) >= n:
            break
        if not raw.strip():
            continue
        requests.append(_line_request(raw, number, path, max_tokens))
    if not requests:
        raise ConfigurationError(f"{path} holds no requests")
    return requests


def _line_request(raw: str, number: int, path: Path, cap: int) -> BenchRequest:
    where = f"{path}:{number}"
    try:
        line: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{where}: not JSON ({exc.msg})") from exc
    body = line.get("body") if isinstance(line, dict) else None
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        raise ConfigurationError(f"{where}: no body.messages list (an OpenAI batch input line)")
    assert isinstance(body, dict)
    asked = body.get("max_tokens", body.get("max_completion_tokens"))
    if asked is not None and (type(asked) is not int or asked < 1):
        raise ConfigurationError(f"{where}: max_tokens must be a positive integer, got {asked!r}")
    return BenchRequest(
        custom_id=str(line.get("custom_id") or f"line-{number}"),
        messages=messages,
        max_tokens=min(asked, cap) if asked is not None else cap,
    )
