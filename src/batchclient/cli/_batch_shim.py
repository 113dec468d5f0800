"""Stand-ins for the batch providers' options while ``batchclient.batchapi`` declares them as
plain ``TypedDict`` entries: the CLI derives flags from these as from any declared options
``TypedDict``. Each stand-in uses the names the naming rule gives (``poll_interval_s``,
``timeout_s``), with the provider's own defaults read from its signature, and :func:`options_for`
maps them back to the names the provider takes today. Once an entry's options are declared
with ``Option(...)``, :func:`stand_in` returns them unchanged and nothing here applies.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, TypedDict

from .._options import Option, is_declared
from .._registry import ProviderEntry
from ..batchapi import (
    FLAVORS,
    AnthropicBatchInference,
    AnthropicBatchProvider,
    BatchAPIBatchInference,
    BatchAPIProvider,
    GeminiBatchInference,
    GeminiBatchProvider,
)

__all__ = ["options_for", "stand_in"]

RENAMED = {"poll_interval_s": "poll_interval", "timeout_s": "timeout"}
"""Stand-in name -> the name the batch providers take today."""


def _default(cls: Any, name: str) -> Any:
    return inspect.signature(cls).parameters[RENAMED.get(name, name)].default


_POLL = "Seconds between two polls of a remote batch."
_RETRIES = "Retries of one API call."
_TIMEOUT = "Seconds one API call may take."
_LINES = "Most requests in one remote batch; more are split (None: the provider's limit)."
_BYTES = "Largest remote batch in bytes (None: the provider's limit)."


class BatchAPIFlags(TypedDict, total=False):
    flavor: Annotated[
        str | None,
        Option(
            None,
            f"Which provider's variant of the Batch API ({', '.join(sorted(FLAVORS))}; None: "
            "from the base URL's host, else openai).",
            metavar="NAME",
        ),
    ]
    poll_interval_s: Annotated[float, Option(_default(BatchAPIProvider, "poll_interval_s"), _POLL)]
    max_retries: Annotated[int, Option(_default(BatchAPIProvider, "max_retries"), _RETRIES)]
    timeout_s: Annotated[float, Option(_default(BatchAPIProvider, "timeout_s"), _TIMEOUT)]
    max_lines: Annotated[int | None, Option(_default(BatchAPIBatchInference, "max_lines"), _LINES)]
    max_bytes: Annotated[int | None, Option(_default(BatchAPIBatchInference, "max_bytes"), _BYTES)]


class AnthropicFlags(TypedDict, total=False):
    poll_interval_s: Annotated[
        float, Option(_default(AnthropicBatchProvider, "poll_interval_s"), _POLL)
    ]
    max_retries: Annotated[int, Option(_default(AnthropicBatchProvider, "max_retries"), _RETRIES)]
    timeout_s: Annotated[float, Option(_default(AnthropicBatchProvider, "timeout_s"), _TIMEOUT)]
    max_lines: Annotated[int | None, Option(_default(AnthropicBatchInference, "max_lines"), _LINES)]
    max_bytes: Annotated[int | None, Option(_default(AnthropicBatchInference, "max_bytes"), _BYTES)]


class GeminiFlags(TypedDict, total=False):
    poll_interval_s: Annotated[
        float, Option(_default(GeminiBatchProvider, "poll_interval_s"), _POLL)
    ]
    max_retries: Annotated[int, Option(_default(GeminiBatchProvider, "max_retries"), _RETRIES)]
    timeout_s: Annotated[float, Option(_default(GeminiBatchProvider, "timeout_s"), _TIMEOUT)]
    max_lines: Annotated[int | None, Option(_default(GeminiBatchInference, "max_lines"), _LINES)]
    max_bytes: Annotated[int | None, Option(_default(GeminiBatchInference, "max_bytes"), _BYTES)]


_STAND_INS: dict[str, type] = {
    "batch-api": BatchAPIFlags,
    "anthropic-batch": AnthropicFlags,
    "gemini-batch": GeminiFlags,
}


def stand_in(entry: ProviderEntry) -> type | None:
    """The options ``TypedDict`` the CLI derives ``entry``'s flags from: its own where it is
    declared with ``Option``, else its stand-in here (None: no flags)."""
    if is_declared(entry.options):
        return entry.options
    return _STAND_INS.get(entry.name)


def options_for(entry: ProviderEntry, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` (flag values by stand-in name) under the names ``entry`` takes."""
    if is_declared(entry.options):
        return given
    return {RENAMED.get(name, name): value for name, value in given.items()}
