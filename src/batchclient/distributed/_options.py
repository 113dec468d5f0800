"""``RayOptions``: the named keyword options of :class:`RayProvider`, declared once.

As with the inline provider, vLLM's engine arguments come on top (``**engine_args``), which a
``TypedDict`` cannot leave open, so ``RayBatchInference`` spells these options out itself;
``tests/test_options.py`` holds the three to the same names, types and defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

__all__ = ["RayOptions"]


class RayOptions(TypedDict, total=False):
    """The named keyword options of ``RayProvider`` (documented on
    :class:`~batchclient.RayBatchInference`); engine arguments come on top."""

    replicas: int
    address: str | None
    resources_per_replica: Mapping[str, Any] | None
    max_concurrency: int
    max_restarts: int
    cores_per_replica: int | None
    restart_wait_s: float
    tool_call_parser: str | None
    single_token_scoring: bool
    prefix_affinity: bool
    runtime_env: Mapping[str, Any] | None
