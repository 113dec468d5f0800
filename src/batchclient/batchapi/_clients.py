"""The batch clients: ``BatchClient`` over a :class:`~._provider.RemoteBatchProvider` with
``execution=RemoteBatchExecution(provider)`` (guide: ``docs/batch-api.md``)."""

from __future__ import annotations

import os
from typing import Unpack

from .._core.client import BatchClient
from .._options import document
from ._execution import RemoteBatchExecution
from ._options import AnthropicBatchOptions, BatchAPIOptions, GeminiBatchOptions
from ._provider import RemoteBatchProvider

__all__ = ["AnthropicBatchInference", "BatchAPIBatchInference", "GeminiBatchInference"]


class _RemoteBatchClient(BatchClient):
    provider: RemoteBatchProvider

    def __init__(
        self,
        provider: RemoteBatchProvider,
        state_dir: str | os.PathLike[str] | None,
        database: str | None = None,
    ) -> None:
        super().__init__(
            provider,
            state_dir=state_dir,
            execution=RemoteBatchExecution(provider),
            database=database,
        )

    @property
    def base_url(self) -> str:
        """The API root, without credentials."""
        return self.provider.base_url


@document(BatchAPIOptions)
class BatchAPIBatchInference(_RemoteBatchClient):
    """Batch inference through a remote OpenAI-shaped Batch API (``/v1/files`` +
    ``/v1/batches``): OpenAI's discounted batches, Together, Groq, Mistral, or another
    ``batchclient serve``. Use as ``async with``.

    Args:
        base_url: the API root ending in ``/v1``: ``https://api.openai.com/v1``, a
            ``batchclient serve`` (``http://host:port/v1``), ``https://api.together.xyz/v1``,
            ``https://api.groq.com/openai/v1`` or ``https://api.mistral.ai/v1``.
        api_key: sent as ``Authorization: Bearer <api_key>``; None sends no header.
        state_dir: where files, jobs, remote batch ids and results are kept (default
            ``$BATCHCLIENT_STATE_DIR`` or the user data directory).
        database: a ``postgresql://`` URL keeping the state there instead of ``state_dir``
            (default ``$BATCHCLIENT_DATABASE_URL``; see :class:`~batchclient.BatchClient`).
        options: the options below (:class:`BatchAPIOptions`).

    Raises:
        ConfigurationError: a bad argument (an unknown flavour, a window it refuses, ...).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        database: str | None = None,
        **options: Unpack[BatchAPIOptions],
    ) -> None:
        provider = RemoteBatchProvider.batch_api(base_url, api_key=api_key, **options)
        super().__init__(provider, state_dir, database)


@document(AnthropicBatchOptions)
class AnthropicBatchInference(_RemoteBatchClient):
    """Batch inference through Anthropic Message Batches (half the price of live calls), on
    the ``anthropic`` SDK (``pip install 'batchclient[anthropic]'``). Use as ``async with``.
    Requests stay OpenAI chat bodies; answers come back as OpenAI ``chat.completion`` bodies
    (translation: ``docs/batch-api.md``); a field Anthropic cannot honour is that item's
    ``unsupported_parameter`` error.

    Args:
        base_url: the API root (default ``$ANTHROPIC_BASE_URL`` or
            ``https://api.anthropic.com``): a gateway, or a test stub.
        api_key: the API key (default ``$ANTHROPIC_API_KEY``).
        state_dir: where files, jobs, remote batch ids and results are kept.
        database: a ``postgresql://`` URL keeping the state there instead of ``state_dir``
            (default ``$BATCHCLIENT_DATABASE_URL``; see :class:`~batchclient.BatchClient`).
        options: the options below (:class:`AnthropicBatchOptions`).

    Raises:
        ConfigurationError: a bad argument, no API key, or the SDK not installed.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        database: str | None = None,
        **options: Unpack[AnthropicBatchOptions],
    ) -> None:
        provider = RemoteBatchProvider.anthropic(base_url, api_key=api_key, **options)
        super().__init__(provider, state_dir, database)


@document(GeminiBatchOptions)
class GeminiBatchInference(_RemoteBatchClient):
    """Batch inference through Google's Gemini Batch API (half the price of live calls), on
    the ``google-genai`` SDK (``pip install 'batchclient[gemini]'``). Use as ``async with``.
    Requests stay OpenAI chat bodies; each is translated to a ``GenerateContentRequest`` and
    its answer back to a ``chat.completion`` (``docs/batch-api.md``); a field Gemini cannot
    honour is that item's ``unsupported_parameter`` error.

    Args:
        base_url: the API host (default ``https://generativelanguage.googleapis.com``): a
            gateway, or a loopback stub in tests.
        api_key: the Gemini API key; default ``$GEMINI_API_KEY``, else ``$GOOGLE_API_KEY``.
        state_dir: where files, jobs, remote batch ids and results are kept.
        database: a ``postgresql://`` URL keeping the state there instead of ``state_dir``
            (default ``$BATCHCLIENT_DATABASE_URL``; see :class:`~batchclient.BatchClient`).
        options: the options below (:class:`GeminiBatchOptions`).

    Raises:
        ConfigurationError: a bad argument, or no API key.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        database: str | None = None,
        **options: Unpack[GeminiBatchOptions],
    ) -> None:
        provider = RemoteBatchProvider.gemini(base_url, api_key=api_key, **options)
        super().__init__(provider, state_dir, database)
