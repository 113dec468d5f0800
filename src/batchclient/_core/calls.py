"""A call's arguments -> its requests, in two steps that every call kind shares.

1. **Check now.** Everything about the call as a whole is checked when the call starts, before
   the first request is built or sent: lists aligned with the items (``custom_ids``,
   ``sampling_params``, ``response_format``, ``logprobs``), options with a closed set of values
   (``encoding_format``, ``tool_choice``), definitions that must parse (tools, response
   formats, sampling parameters). A problem is a :class:`~batchclient.ConfigurationError`
   raised by the call itself (the protocol's contract), never an error out of the scheduler's
   task group halfway through a batch.
2. **Build lazily.** The requests are then built one by one as the scheduler pulls them
   (:func:`lazy_requests`), so a call over a million items never holds a million bodies. What
   is wrong with one item only (a malformed message, an empty input) is that item's error at
   its position, not the call's.

``batch_chat_completion`` (:func:`.encode.chat_requests`), ``batch_completion``
(:func:`.completions.completion_requests`), ``batch_embeddings``
(:func:`.embeddings.embedding_requests`) and the scoring calls
(:func:`.scoring.loglikelihood_requests`) are all built this way, for every client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pydantic import ValidationError

from .._invalid import describe
from ..errors import ConfigurationError
from ..types import SamplingParams
from .request import Request

__all__ = ["aligned", "check_custom_ids", "lazy_requests", "per_item_sampling"]


def check_custom_ids(custom_ids: Sequence[str] | None, n: int, items: str) -> None:
    """Raise ``ConfigurationError`` unless ``custom_ids`` is None or has one id per item
    (``items`` names them in the message: "conversations", "prompts", ...)."""
    if custom_ids is not None and len(custom_ids) != n:
        raise ConfigurationError(f"custom_ids has {len(custom_ids)} entries for {n} {items}")


def per_item_sampling(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, n: int, items: str
) -> Sequence[SamplingParams]:
    """One ``SamplingParams`` per item: the default, the one given for all, or the list given
    (its dicts validated now). Raises ``ConfigurationError`` for a list of the wrong length or
    an entry that is not valid sampling parameters."""
    if sampling_params is None:
        return [SamplingParams()] * n
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    params = list(sampling_params)
    if len(params) != n:
        raise ConfigurationError(f"sampling_params has {len(params)} entries for {n} {items}")
    try:
        return [
            p if isinstance(p, SamplingParams) else SamplingParams.model_validate(p) for p in params
        ]
    except ValidationError as exc:
        raise ConfigurationError(f"bad sampling_params: {describe(exc)}") from exc


def aligned(name: str, value: Any, n: int, items: str, coerce: Callable[[Any], Any]) -> list[Any]:
    """One value for all ``n`` items, or a list (or tuple) aligned with them; each coerced now
    (``coerce`` raises ``ConfigurationError`` for a bad one)."""
    if isinstance(value, list | tuple):
        if len(value) != n:
            raise ConfigurationError(f"{name} has {len(value)} entries for {n} {items}")
        return [coerce(v) for v in value]
    return [coerce(value)] * n


def lazy_requests(
    n: int,
    custom_ids: Sequence[str] | None,
    items: str,
    build: Callable[[int, str | None], Request],
) -> Iterator[Request]:
    """The call's requests, ``build(i, custom_id)`` for each item ``i`` in order, built only as
    they are pulled. ``custom_ids`` is checked now (``ConfigurationError``), with whatever the
    caller checked before calling this: nothing that can fail for the whole call may be left
    to ``build``."""
    check_custom_ids(custom_ids, n, items)
    return _built(n, custom_ids, build)


def _built(
    n: int, custom_ids: Sequence[str] | None, build: Callable[[int, str | None], Request]
) -> Iterator[Request]:
    for i in range(n):
        yield build(i, custom_ids[i] if custom_ids is not None else None)
