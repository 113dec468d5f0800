"""What scoring needs from a model's tokenizer, and a wrapper for Hugging Face tokenizers.

Log-likelihood scoring sends token ids, not text (``docs/evals.md``): the context and the
continuation must be split at a token boundary the caller chose, exactly as
lm-evaluation-harness splits them, or the scores are not comparable. A provider hands out a
:class:`Tokenizer` for a model (``Provider.tokenizer``): the inline engine's own, a local
tokenizer folder, or a server's ``/tokenize`` route.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from ..errors import ConfigurationError
from ..types import BatchItemError, TokenizerInfo

__all__ = ["HFTokenizer", "Tokenizer", "TokenizerInfo", "local_tokenizer"]

_THREAD_MIN_TEXTS = 64  # fewer texts than this are encoded on the event loop (microseconds)


class Tokenizer(abc.ABC):
    """A model's tokenizer, as the scoring calls use it."""

    @abc.abstractmethod
    async def info(self) -> TokenizerInfo:
        """The tokenizer's :class:`TokenizerInfo` (asked once, then cached by implementations)."""

    @abc.abstractmethod
    async def encode(
        self, texts: Sequence[str], *, add_special_tokens: bool = True
    ) -> list[list[int] | BatchItemError]:
        """Token ids of each text, in order; a text that cannot be encoded gets its error in
        its place (never raises for one text). ``add_special_tokens`` as in Hugging Face
        tokenizers (a BOS token for models whose tokenizer adds one)."""


class HFTokenizer(Tokenizer):
    """A Hugging Face tokenizer object (``transformers``' or the one vLLM's engine holds), with
    the model's context length. Large batches are encoded in a worker thread."""

    def __init__(self, tokenizer: Any, max_model_len: int | None) -> None:
        self._tokenizer = tokenizer
        self._info = TokenizerInfo(
            max_model_len=max_model_len,
            bos_token=_str_or_none(getattr(tokenizer, "bos_token", None)),
            bos_token_id=_int_or_none(getattr(tokenizer, "bos_token_id", None)),
            eos_token_id=_int_or_none(getattr(tokenizer, "eos_token_id", None)),
        )

    @property
    def tokenizer(self) -> Any:
        """The wrapped tokenizer (for chat templates)."""
        return self._tokenizer

    async def info(self) -> TokenizerInfo:
        return self._info

    async def encode(
        self, texts: Sequence[str], *, add_special_tokens: bool = True
    ) -> list[list[int] | BatchItemError]:
        if not texts:
            return []
        if len(texts) < _THREAD_MIN_TEXTS:
            return self._encode(list(texts), add_special_tokens)
        return await anyio.to_thread.run_sync(self._encode, list(texts), add_special_tokens)

    def _encode(
        self, texts: list[str], add_special_tokens: bool
    ) -> list[list[int] | BatchItemError]:
        ids = self._tokenizer(texts, add_special_tokens=add_special_tokens).input_ids
        return [list(map(int, row)) for row in ids]


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def local_tokenizer(path: str | os.PathLike[str], max_model_len: int | None) -> HFTokenizer:
    """The Hugging Face tokenizer in ``path`` (a local folder; never a hub download)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ConfigurationError(f"tokenizer={str(path)!r} is not a folder")
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ConfigurationError(
            f"tokenizer= needs the transformers package (pip install transformers): {exc}"
        ) from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot load a tokenizer from {folder}: {exc}") from exc
    return HFTokenizer(tokenizer, max_model_len)
