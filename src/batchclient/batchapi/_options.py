"""``BatchAPIOptions``: the keyword options of :class:`BatchAPIProvider`, declared once.

``BatchAPIBatchInference`` takes them as ``**options: Unpack[BatchAPIOptions]`` beside its own
(``max_lines``, ``max_bytes``, ``on_expired``, ``expiry_grace_s``, ``state_dir``);
``tests/test_options.py`` checks them against ``BatchAPIProvider.__init__``.
"""

from __future__ import annotations

from typing import TypedDict

from .._routing.settings import RetryPolicy

__all__ = ["BatchAPIOptions"]


class BatchAPIOptions(TypedDict, total=False):
    """The keyword options of ``BatchAPIProvider`` (documented on
    :class:`~batchclient.BatchAPIBatchInference`)."""

    poll_interval: float
    completion_window: str
    max_retries: int
    timeout: float
    retry: RetryPolicy
    headers: dict[str, str] | None
    check_model: bool
    flavor: str | None
