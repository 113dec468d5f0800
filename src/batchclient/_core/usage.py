"""The token classes of one answer's ``usage``, read in one place for items, calls, jobs and
``/metrics``.

Every provider's answer reaches this module in OpenAI's ``usage`` shape (the translations of
Anthropic's and Gemini's answers write it so):

- ``prompt_tokens``: every input token, cached and cache-written ones included (OpenAI counts
  cached tokens in it; the Anthropic translation adds ``cache_read_input_tokens`` and
  ``cache_creation_input_tokens`` to ``input_tokens``);
- ``prompt_tokens_details.cached_tokens``: input read from a prompt cache (OpenAI, vLLM servers
  and the inline engine's prefix cache; Anthropic's ``cache_read_input_tokens``, Gemini's
  ``cachedContentTokenCount``);
- ``cache_creation_input_tokens``: input written to a prompt cache (Anthropic's, kept under its
  name: OpenAI's shape has no field for it);
- ``completion_tokens``, and ``completion_tokens_details.reasoning_tokens`` among them.

A value that is not a non-negative integer counts as 0: nothing a server sends raises here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["TOKEN_KINDS", "TokenCounts", "token_counts"]

TOKEN_KINDS = ("prompt", "cached", "cache_write", "completion", "reasoning")
"""The classes, as ``/metrics`` labels them (``batchclient_tokens_total{kind}``)."""


class TokenCounts(NamedTuple):
    """One answer's tokens by class (fields in :data:`TOKEN_KINDS` order)."""

    prompt: int = 0
    cached: int = 0
    cache_write: int = 0
    completion: int = 0
    reasoning: int = 0


def _count(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0


def _detail(usage: dict[str, Any], details: str, name: str) -> int:
    found = usage.get(details)
    return _count(found.get(name)) if isinstance(found, dict) else 0


def token_counts(usage: Any) -> TokenCounts:
    """The token classes of an answer's ``usage`` (module docstring), or of a ``Response``'s
    (``input_tokens``, ``input_tokens_details.cached_tokens`` and ``.cache_write_tokens``,
    ``output_tokens``, ``output_tokens_details.reasoning_tokens``); all 0 for anything that is
    not a dict."""
    if not isinstance(usage, dict):
        return TokenCounts()
    if "prompt_tokens" not in usage and "input_tokens" in usage:  # the Responses API's
        return TokenCounts(
            _count(usage.get("input_tokens")),
            _detail(usage, "input_tokens_details", "cached_tokens"),
            _detail(usage, "input_tokens_details", "cache_write_tokens"),
            _count(usage.get("output_tokens")),
            _detail(usage, "output_tokens_details", "reasoning_tokens"),
        )
    return TokenCounts(
        _count(usage.get("prompt_tokens")),
        _detail(usage, "prompt_tokens_details", "cached_tokens"),
        _count(usage.get("cache_creation_input_tokens")),
        _count(usage.get("completion_tokens")),
        _detail(usage, "completion_tokens_details", "reasoning_tokens"),
    )
