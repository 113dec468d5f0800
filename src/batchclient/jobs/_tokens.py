"""Counting the prompt tokens of chat request bodies, for dry runs.

With a local tokenizer (a model directory) the count is exact for servers that apply the
model's chat template as vLLM's does: the template rendered with the generation prompt, then
tokenized without adding special tokens again (the template writes them). Without one it is an
estimate: about 4 characters per token (OpenAI's rule of thumb for English text) plus 3 tokens
per message and 3 to prime the reply (the per-message overhead in OpenAI's cookbook "How to
count tokens with tiktoken").

A folder with ``tokenizer.json`` and a chat template is read with the ``tokenizers`` library and
rendered with transformers' own template renderer (``render_jinja_template``, what
``apply_chat_template`` calls), without ``AutoTokenizer``: that imports torch, 640 MiB of memory
and seconds of start-up for a dry run. Anything else goes through ``AutoTokenizer``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
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
        self._tok: Any = None  # an AutoTokenizer, or None with the fast path below
        self._fast: Any = None  # a tokenizers.Tokenizer
        self._template: str | None = None
        self._special: dict[str, str] = {}
        if tokenizer is None:
            return
        try:
            if not self._load_fast(Path(tokenizer)):
                from transformers import AutoTokenizer

                self._tok = AutoTokenizer.from_pretrained(str(tokenizer))
        except Exception as exc:  # ImportError, OSError, ValueError: all "cannot load"
            raise ConfigurationError(
                f"cannot load the tokenizer {tokenizer}: {type(exc).__name__}: {exc}"
            ) from exc

    def _load_fast(self, folder: Path) -> bool:
        """Read ``tokenizer.json`` and the chat template of a folder; False if it has none."""
        config_file = folder / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        template_file = folder / "chat_template.jinja"
        template = (
            template_file.read_text() if template_file.is_file() else config.get("chat_template")
        )
        if not (folder / "tokenizer.json").is_file() or not isinstance(template, str):
            return False
        from tokenizers import Tokenizer

        self._fast = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._template = template
        for key, value in config.items():  # bos_token, eos_token, ...: what templates may use
            if key.endswith("_token") and isinstance(value, dict):
                value = value.get("content")
            if key.endswith("_token") and isinstance(value, str):
                self._special[key] = value
        return True

    def count(self, bodies: list[dict[str, Any]]) -> list[int]:
        """Prompt tokens of each body."""
        if self._tok is None and self._fast is None:
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
        lengths = iter(self._encode(texts) if texts else [])
        return [n if n is not None else next(lengths) for n in counts]

    def _encode(self, texts: list[str]) -> list[int]:
        if self._fast is not None:
            encoded = self._fast.encode_batch_fast(texts, add_special_tokens=False)
            return [len(e.ids) for e in encoded]
        return [len(ids) for ids in self._tok(texts, add_special_tokens=False)["input_ids"]]

    def _render(self, body: dict[str, Any]) -> str:
        messages = [{**m, "content": _text(m.get("content"))} for m in body.get("messages") or ()]
        tools = body.get("tools") or None
        if self._fast is not None:
            from transformers.utils import chat_template_utils

            # annotated as returning str; it returns (rendered conversations, generation indices)
            render: Any = chat_template_utils.render_jinja_template
            rendered, _ = render(
                conversations=[messages],
                tools=tools,
                chat_template=self._template,
                add_generation_prompt=True,
                **self._special,
            )
            return str(rendered[0])
        text: str = self._tok.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        return text
