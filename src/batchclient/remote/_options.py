"""``RemoteOptions``: the keyword options of :class:`RemoteProvider`, declared once.

``RemoteBatchInference`` takes them as ``**options: Unpack[RemoteOptions]`` and hands them to
the provider, and the provider registry (``batchclient run --provider remote``, ``serve``, the
lm-eval model) passes them by name, so a new option is added in two places: here and in
``RemoteProvider.__init__`` (``tests/test_options.py`` checks the two agree). What each option
does is documented on :class:`~batchclient.RemoteBatchInference`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TypedDict

from .._routing.settings import AdaptiveConcurrency, Ejection, RateLimits, RetryPolicy
from ._settings import HttpOptions, Timeouts
from ._setup import Verify

__all__ = ["RemoteOptions"]


class RemoteOptions(TypedDict, total=False):
    """The keyword options of ``RemoteProvider`` (every one optional; the defaults are the
    provider's)."""

    max_concurrency: int
    max_retries: int
    timeout: float
    rpm: float | None
    tpm: float | None
    headers: Mapping[str, str] | None
    default_query: Mapping[str, str] | None
    proxy: str | None
    trust_env: bool
    verify: Verify
    adaptive: AdaptiveConcurrency | bool
    retry: RetryPolicy
    rate_limits: RateLimits
    ejection: Ejection
    timeouts: Timeouts
    http: HttpOptions
    check_model: bool
    tokenizer: str | os.PathLike[str] | None
    embedding_group_size: int
    prefix_affinity: bool
