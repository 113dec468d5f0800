"""``GeminiBatchInference``: the protocol over the Gemini Batch API (Developer API), durable as
``BatchAPIBatchInference`` is; ``GeminiBatchProvider``: its connection as a ``Provider``.
Guide: ``docs/batch-api.md``."""

from __future__ import annotations

import os
from typing import TypedDict, Unpack

from .._core.client import BatchClient
from .._core.provider import Provider
from .._routing.settings import RetryPolicy
from ..errors import ConfigurationError
from ..jobs import parse_window
from ._backend_provider import BackendProvider
from ._backend_runner import BackendRunner
from ._client import RemoteJobClient
from ._gemini import INLINE_BYTES, INLINE_CAP, MAX_BYTES, MAX_LINES, GeminiBackend, resolve_key
from ._parts import Limits
from ._runner import RunSettings

__all__ = ["GeminiBatchInference", "GeminiBatchOptions", "GeminiBatchProvider"]


class GeminiBatchOptions(TypedDict, total=False):
    """The keyword options of :class:`GeminiBatchProvider` (documented on
    :class:`GeminiBatchInference`)."""

    base_url: str | None
    poll_interval: float
    max_retries: int
    timeout: float
    retry: RetryPolicy
    headers: dict[str, str] | None


class GeminiBatchProvider(BackendProvider):
    """The Gemini Batch API as a :class:`~batchclient.Provider` (``execute`` runs one request as
    a one-request batch: correct, slow). Arguments as :class:`GeminiBatchInference`."""

    backend: GeminiBackend

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        poll_interval: float = 30.0,
        max_retries: int = 8,
        timeout: float = 600.0,
        retry: RetryPolicy = RetryPolicy(),
        headers: dict[str, str] | None = None,
    ) -> None:
        backend = GeminiBackend(
            resolve_key(api_key), base_url=base_url, poll_interval=poll_interval,
            max_retries=max_retries, timeout=timeout, retry=retry, headers=headers,
        )  # fmt: skip
        super().__init__(backend)

    @property
    def base_url(self) -> str:
        return self.backend.base_url


class GeminiBatchInference(RemoteJobClient):
    """Batch inference through Google's Gemini Batch API (half the price of live calls), on the
    ``google-genai`` SDK (``pip install 'batchclient[gemini]'``). Use as ``async with``.

    Requests stay OpenAI chat bodies; each is translated to a ``GenerateContentRequest`` and its
    answer back to a ``chat.completion`` (what is kept and what is refused: ``docs/batch-api.md``).
    A field Gemini cannot honour is that item's ``unsupported_parameter`` error.

    Args (every one after ``api_key`` keyword-only; ``base_url``, ``poll_interval``,
    ``max_retries``, ``timeout``, ``retry`` and ``headers`` are :class:`GeminiBatchOptions`, the
    provider's):
        api_key: the Gemini API key; default ``$GEMINI_API_KEY``, else ``$GOOGLE_API_KEY``.
        base_url: the API host (default ``https://generativelanguage.googleapis.com``): a
            gateway, or a loopback stub in tests.
        poll_interval: seconds between two polls of a remote batch (default 30).
        max_attempts: the most remote batches one request is sent in (default 3): requests that
            come back expired, cancelled by someone else, or with a retryable error
            (``UNAVAILABLE``, ``INTERNAL``, ``DEADLINE_EXCEEDED``, ``RESOURCE_EXHAUSTED``) go
            into a new batch; everything that succeeded or failed for good is kept.
        max_lines: the most requests in one remote batch (default 100,000); larger inputs are
            split into several batches that run at once.
        max_bytes: the largest remote batch input in bytes (default 95% of Gemini's 2 GB).
        inline_bytes: batches up to this size are sent inline in the create call, larger ones
            uploaded as a JSONL file first (default 1 MiB: inline requests go through the SDK's
            types, slower than an upload for large batches; at most 95% of Gemini's 20 MB
            inline cap).
        completion_window: how long the local job waits for its batches (default ``"48h"``,
            after which Gemini expires a batch itself); then, after ``expiry_grace_s``, its
            remote batches are cancelled and what they did not run is ``batch_expired`` (or
            re-run live by ``on_expired``).
        on_expired: a provider (or a client: its provider) that re-runs, live, what expired.
        expiry_grace_s: seconds past the window before the remote batches are cancelled
            (default 600).
        timeout: seconds one HTTP call may take (default 600).
        max_retries: retries of a transient failure (connection error, 408/409/429/5xx) of an
            upload, create, cancel or download (default 8); polls retry without limit. The
            server's ``Retry-After`` is honoured (up to ``retry.retry_after_cap_s``).
        retry: backoff between retries (:class:`~batchclient.RetryPolicy`).
        headers: extra HTTP headers for every call.
        state_dir: where files, jobs, remote batch ids and results are kept.

    Raises:
        ConfigurationError: a bad argument, or no API key.
    """

    provider: GeminiBatchProvider

    def __init__(
        self,
        api_key: str | None = None,
        *,
        max_attempts: int = 3,
        max_lines: int = MAX_LINES,
        max_bytes: int = MAX_BYTES,
        inline_bytes: int = INLINE_BYTES,
        completion_window: str = "48h",
        on_expired: Provider | BatchClient | None = None,
        expiry_grace_s: float = 600.0,
        state_dir: str | os.PathLike[str] | None = None,
        **options: Unpack[GeminiBatchOptions],
    ) -> None:
        if max_attempts < 1:
            raise ConfigurationError("max_attempts must be >= 1")
        if expiry_grace_s < 0:
            raise ConfigurationError("expiry_grace_s must be >= 0 seconds")
        try:
            parse_window(completion_window)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        if max_lines < 1 or max_bytes < 1024:
            raise ConfigurationError("max_lines must be >= 1 and max_bytes >= 1024")
        if not 0 <= inline_bytes <= INLINE_CAP:
            raise ConfigurationError(
                f"inline_bytes must be between 0 and {INLINE_CAP} (95% of Gemini's 20 MB cap)"
            )
        provider = GeminiBatchProvider(api_key, **options)
        backend = provider.backend
        backend.limits = Limits(max_lines, max_bytes)
        backend.inline_bytes = inline_bytes
        live = on_expired.provider if isinstance(on_expired, BatchClient) else on_expired
        settings = RunSettings(backend.limits, backend.poll_interval_s, expiry_grace_s)
        super().__init__(
            provider,
            BackendRunner(backend, provider, settings, max_attempts, live),
            completion_window=completion_window,
            poll_interval=backend.poll_interval_s,
            on_expired=live,
            state_dir=state_dir,
        )

    @property
    def base_url(self) -> str:
        return self.provider.base_url
