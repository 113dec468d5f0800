"""Counting the prompt tokens of chat request bodies, for dry runs.

With a local tokenizer (a model directory) the count is exact for servers that apply the
model's chat template as vLLM's does: the template rendered with the generation prompt, then
tokenized without adding special tokens again (the template writes them). Without one it is an
estimate: about 4 characters per token (OpenAI's rule of thumb for English text) plus 3 tokens
per message and 3 to prime the reply (the per-message overhead in OpenAI's cookbook "How to
count tokens with tiktoken").
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigurationError

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 3
TOKENS_PER_REPLY = 3


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return "" if content is None else str(content)


def estimate_tokens(body: dict[str, Any]) -> int:
    """The estimate for one body (see the module's docstring); tools count as their JSON."""
    messages = body.get("messages") or []
    chars = sum(len(_text(m.get("content"))) for m in messages if isinstance(m, dict))
    if body.get("tools"):
        chars += len(str(body["tools"]))
    return -(-chars // CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages) + TOKENS_PER_REPLY


class PromptCounter:
    """Counts prompt tokens of bodies, in blocks. ``tokenizer`` is a local directory (or a
    name the tokenizer library can load offline), or None for the estimate. ``estimated``
    stays True when any prompt was estimated (no tokenizer, or a template that failed on it).

    Raises ``ConfigurationError`` when the tokenizer cannot be loaded.
    """

    def __init__(self, tokenizer: str | os.PathLike[str] | None) -> None:
        self.name = None if tokenizer is None else str(tokenizer)
        self.estimated = tokenizer is None
        self._tok: Any = None
        if tokenizer is not None:
            try:
                from transformers import AutoTokenizer

                self._tok = AutoTokenizer.from_pretrained(str(tokenizer))
            except Exception as exc:  # ImportError, OSError, ValueError: all "cannot load"
                raise ConfigurationError(
                    f"cannot load the tokenizer {tokenizer}: {type(exc).__name__}: {exc}"
                ) from exc

    def count(self, bodies: list[dict[str, Any]]) -> list[int]:
        """Prompt tokens of each body."""
        if self._tok is None:
            return [estimate_tokens(b) for b in bodies]
        counts: list[int | None] = []
        texts: list[str] = []
        for body in bodies:
            try:
                texts.append(self._render(body))
                counts.append(None)
            except Exception:  # a template that cannot render this conversation
                self.estimated = True
                counts.append(estimate_tokens(body))
        encoded = iter(self._tok(texts, add_special_tokens=False)["input_ids"]) if texts else None
        return [n if n is not None else len(next(encoded)) for n in counts]  # type: ignore[arg-type]

    def _render(self, body: dict[str, Any]) -> str:
        messages = [{**m, "content": _text(m.get("content"))} for m in body.get("messages") or ()]
        text: str = self._tok.apply_chat_template(
            messages, tools=body.get("tools") or None, add_generation_prompt=True, tokenize=False
        )
        return text
