"""Teacher forcing inside vLLM: a logits processor that makes a request generate exactly the
tokens it names, so a continuation of several tokens is scored by one generation request that
reads the prefix cache (a request with ``prompt_logprobs`` never does).

A request names its tokens in ``SamplingParams.extra_args[FORCED_TOKENS]`` (a list of token
ids). At its i-th step every logit but the i-th token's is set to -inf, so greedy sampling
picks it. vLLM computes the log-probabilities it reports from the raw logits, before any logits
processor runs (``logprobs_mode="raw_logprobs"``, its default: ``vllm/v1/sample/sampler.py``),
so with ``logprobs=1`` each step reports the forced token's log-probability and the greedy
token's, as the prompt's log-probabilities at those positions would be. Requests without the
key are left alone.

Imported by the engine core process (vLLM loads the class named in ``logits_processors``), and
by :mod:`._engine` when an engine starts; never by ``import batchclient``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

__all__ = ["FORCED_TOKENS", "ForcedTokens"]

FORCED_TOKENS = "batchclient_forced_tokens"
"""The ``extra_args`` key whose list of token ids a request is made to generate."""


def _forced(params: SamplingParams) -> list[int] | None:
    tokens = (params.extra_args or {}).get(FORCED_TOKENS)
    return tokens if isinstance(tokens, list) and tokens else None


class ForcedTokens(AdapterLogitsProcessor):
    """Makes each request with ``extra_args[FORCED_TOKENS]`` generate those tokens in order."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        tokens = (sampling_params.extra_args or {}).get(FORCED_TOKENS)
        if tokens is None:
            return
        if not (
            isinstance(tokens, list)
            and tokens
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens)
        ):
            raise ValueError(f"extra_args[{FORCED_TOKENS!r}] must be a list of token ids")

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the argmax

    def new_req_logits_processor(
        self, params: SamplingParams
    ) -> Callable[[list[int], torch.Tensor], torch.Tensor] | None:
        tokens = _forced(params)
        if tokens is None:
            return None

        def force(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            step = len(output_ids)
            if step < len(tokens) and tokens[step] < logits.shape[-1]:
                token = tokens[step]
                kept = logits[token].clone()
                logits.fill_(float("-inf"))
                logits[token] = kept
            return logits

        return force


def processors(given: Any) -> list[Any]:
    """``logits_processors`` for the engine: the caller's, then :class:`ForcedTokens`."""
    return [*(given or ()), ForcedTokens]
