"""Counting the prompt tokens of request bodies: chat ``messages``, a completions ``prompt``
and an embeddings ``input`` (each text, a list of texts, token ids or a list of those).

The one estimate of a request's prompt size: dry runs count with it (``client.estimate``,
``batchclient run --dry-run``), and the remote provider's ``tpm`` limit charges each request
with :func:`estimate_prompt_tokens` before sending it.

With a local tokenizer (a model directory) the count is exact for servers that do as vLLM's
does: chat messages are the model's chat template rendered with the generation prompt, then
tokenized without adding special tokens again (the template writes them); a completions prompt
or an embeddings input is tokenized with the tokenizer's special tokens (vLLM's default for
those endpoints). Token ids count one each, always. Without a tokenizer it is an estimate:
about 4 characters per token (OpenAI's rule of thumb for English text), plus 3 tokens per
message and 3 to prime the reply for chat (the per-message overhead in OpenAI's cookbook "How
to count tokens with tiktoken").

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

__all__ = ["PromptCounter", "estimate_prompt_tokens", "prompt_parts"]

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 3
TOKENS_PER_REPLY = 3

Part = str | list[int]
"""One text or one list of token ids of a completions prompt or an embeddings input."""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return "" if content is None else str(content)


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def prompt_parts(body: dict[str, Any]) -> list[Part] | None:
    """The texts and token-id lists of a completions ``prompt`` or an embeddings ``input``
    (a list of them is one part each; anything else in it is skipped); None for a body with
    neither (a chat body)."""
    for key in ("prompt", "input"):
        if key not in body:
            continue
        value = body[key]
        if isinstance(value, str) or (_token_ids(value) and value):
            return [value]
        if isinstance(value, list):
            return [v for v in value if isinstance(v, str) or _token_ids(v)]
        return []
    return None


def _chars(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """The estimate for one body (see the module's docstring): a prompt's or input's texts at
    4 characters per token and its token ids one each; chat messages at 4 characters per token
    plus the per-message and reply overhead; tools count as their JSON text."""
    parts = prompt_parts(body)
    if parts is not None:
        return sum(_chars(p) if isinstance(p, str) else len(p) for p in parts)
    messages = body.get("messages") or []
    chars = 0
    for m in messages:  # once per request sent: a loop, not a generator of calls
        if isinstance(m, dict):
            content = m.get("content")
            chars += len(content) if type(content) is str else len(_text(content))
    if body.get("tools"):
        chars += len(str(body["tools"]))
    return -(-chars // CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages) + TOKENS_PER_REPLY


class PromptCounter:
    """Counts prompt tokens of request bodies (chat, completions, embeddings), in blocks.
    ``tokenizer`` is a local directory (or a name the tokenizer library can load offline), or
    None for the estimate. ``estimated``
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
            return [estimate_prompt_tokens(b) for b in bodies]
        counts: list[int] = []
        # texts to encode, by whether the tokenizer adds its special tokens: not to rendered
        # chat templates (the template wrote them), yes to prompt and input texts
        texts: dict[bool, list[str]] = {False: [], True: []}
        spans: list[tuple[int, bool, int, int]] = []  # (body, special, first text, end)
        for body in bodies:
            parts = prompt_parts(body)
            special = parts is not None
            if parts is not None:
                batch = [p for p in parts if isinstance(p, str)]
                counts.append(sum(len(p) for p in parts if not isinstance(p, str)))
            else:
                try:
                    batch = [self._render(body)]
                except Exception:  # a template that cannot render this conversation
                    self.estimated = True
                    counts.append(estimate_prompt_tokens(body))
                    continue
                counts.append(0)
            first = len(texts[special])
            texts[special].extend(batch)
            spans.append((len(counts) - 1, special, first, len(texts[special])))
        lengths = {flag: self._encode(t, special=flag) if t else [] for flag, t in texts.items()}
        for i, special, first, end in spans:
            counts[i] += sum(lengths[special][first:end])
        return counts

    def _encode(self, texts: list[str], *, special: bool) -> list[int]:
        if self._fast is not None:
            encoded = self._fast.encode_batch_fast(texts, add_special_tokens=special)
            return [len(e.ids) for e in encoded]
        return [len(ids) for ids in self._tok(texts, add_special_tokens=special)["input_ids"]]

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
