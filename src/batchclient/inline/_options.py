"""``VLLMOptions``: the named keyword options of :class:`VLLMProvider`, declared once.

The provider also takes vLLM's engine arguments (``**engine_args``: any ``AsyncEngineArgs``
field), which a ``TypedDict`` cannot leave open (``Unpack`` allows no other keys, and mypy does
not support PEP 728's ``extra_items``), so ``VLLMBatchInference`` spells these options out
itself; ``tests/test_options.py`` holds the three to the same names, types and defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

__all__ = ["VLLMOptions"]


class VLLMOptions(TypedDict, total=False):
    """The named keyword options of ``VLLMProvider`` (documented on
    :class:`~batchclient.VLLMBatchInference`); engine arguments come on top."""

    max_concurrency: int
    tool_call_parser: str | None
    verbose: bool
    cpu_cores: Sequence[int] | None
    single_token_scoring: bool
