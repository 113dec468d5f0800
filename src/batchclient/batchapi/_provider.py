"""``RemoteBatchProvider``: a provider's batch API (a :class:`~._backend.RemoteBatchBackend`) as
a :class:`~batchclient.Provider`, one class for every backend: the connection, identity, model
check and options of the batch clients, which run whole calls and jobs as remote batches
(:class:`~._execution.RemoteBatchExecution`)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Unpack

import anyio
from anyio import to_thread

from .._core.client import BatchClient
from .._core.embeddings import as_requested
from .._core.ledger import Billing
from .._core.provider import Provider
from .._core.request import Request, Result, failed
from .._core.tokens import Tokenizer, local_tokenizer
from .._options import resolve
from ..errors import ConfigurationError, ErrorCode, ModelNotFoundError
from ..jobs._runner import parse_window
from ..jobs._validate import RequestLine
from ..types import Endpoint
from ._anthropic import AnthropicBackend
from ._backend import RemoteBatchBackend
from ._collect import one_result
from ._flavors import check_window
from ._gemini import GeminiBackend
from ._openai import OpenAIBackend
from ._options import AnthropicBatchOptions, BatchAPIOptions, GeminiBatchOptions, RemoteBatchOptions
from ._retry import ApiError, Retrier

__all__ = ["RemoteBatchProvider"]


class RemoteBatchProvider(Provider):
    """A provider's batch API as a :class:`~batchclient.Provider`: ``backend`` with its
    resolved ``options`` (every declared one, defaults filled in), its calls retried by
    ``retrier``. Built by :meth:`batch_api`, :meth:`anthropic` or :meth:`gemini` (or by name:
    ``make_provider("batch-api", ...)``).

    Attributes: ``completion_window`` (the window of a call's remote batches), ``on_expired``
    (the live provider of what they did not run, or None).

    Raises:
        ConfigurationError: a value no batch API takes.
    """

    def __init__(
        self,
        backend: RemoteBatchBackend,
        options: RemoteBatchOptions,
        completion_window: str,
        *,
        check_model: bool = False,
        tokenizer: str | None = None,
    ) -> None:
        _check(options)
        self.backend = backend
        self.options = options
        self.endpoints = backend.endpoints
        self.retrier = Retrier(options["max_retries"], options["retry"])
        self.completion_window = completion_window
        on_expired = options["on_expired"]
        self.on_expired = on_expired.provider if isinstance(on_expired, BatchClient) else on_expired
        self._check_models = check_model
        self._known: set[str] = set()
        self._tokenizer_dir = tokenizer
        self._tokenizers: dict[str, Tokenizer] = {}

    # ------------------------------------------------------------------ the three backends

    @classmethod
    def batch_api(
        cls, base_url: str, *, api_key: str | None = None, **options: Unpack[BatchAPIOptions]
    ) -> RemoteBatchProvider:
        """An OpenAI-shaped Batch API at ``base_url`` (the API root ending in ``/v1``).
        Arguments as :class:`~batchclient.BatchAPIBatchInference`."""
        given = resolve(BatchAPIOptions, options, who="provider 'batch-api'")
        backend = OpenAIBackend(base_url, api_key, given)
        window = given["completion_window"] or "24h"
        check_window(backend.spec, window, backend.base_url)
        return cls(
            backend, given, window, check_model=given["check_model"], tokenizer=given["tokenizer"]
        )

    @classmethod
    def anthropic(
        cls,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        **options: Unpack[AnthropicBatchOptions],
    ) -> RemoteBatchProvider:
        """Anthropic Message Batches. Arguments as :class:`~batchclient.AnthropicBatchInference`."""
        given = resolve(AnthropicBatchOptions, options, who="provider 'anthropic-batch'")
        window = given["completion_window"] or "24h"
        if _seconds(window) != 86400:
            raise ConfigurationError(
                f"completion_window {window!r}: Anthropic Message Batches take only 24h"
            )
        return cls(AnthropicBackend(base_url, api_key, given), given, window)

    @classmethod
    def gemini(
        cls,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        **options: Unpack[GeminiBatchOptions],
    ) -> RemoteBatchProvider:
        """The Gemini Batch API. Arguments as :class:`~batchclient.GeminiBatchInference`."""
        given = resolve(GeminiBatchOptions, options, who="provider 'gemini-batch'")
        window = given["completion_window"] or "48h"  # when Gemini expires a batch itself
        return cls(GeminiBackend(base_url, api_key, given), given, window)

    # ------------------------------------------------------------------ the Provider interface

    @property
    def base_url(self) -> str:
        """The API root, without credentials."""
        return self.backend.base_url

    @property
    def flavor(self) -> str | None:
        """The OpenAI-shaped API's flavour (``openai``, ``together``, ...); None for the
        others."""
        flavor = getattr(self.backend, "flavor", None)
        return flavor if isinstance(flavor, str) else None

    async def start(self) -> None:
        await self.backend.start()
        if self.on_expired is not None:
            try:
                await self.on_expired.start()
            except BaseException:
                await self.backend.stop()
                raise

    async def stop(self) -> None:
        try:
            await self.backend.stop()
        finally:
            if self.on_expired is not None:
                await self.on_expired.stop()

    def identity(self) -> dict[str, Any]:
        return self.backend.identity()

    def billing(self, model: str) -> Billing:
        """The ``batch`` tier with the backend's prompt-cache rule (Anthropic: the model's
        minimum with cache writes billed apart, when it marks prefixes; OpenAI-shaped APIs:
        OpenAI's automatic caching of 1,024 tokens or more; Gemini: its explicit caching rule),
        where the backend has one."""
        rule = getattr(self.backend, "billing", None)
        return rule(model) if rule is not None else Billing("batch")

    async def models(self) -> list[str]:
        return sorted(await self.backend.models() or ())

    async def check_model(self, model: str) -> None:
        # an empty name is wrong on every batch API; a listed one is asked once, where asked
        if not isinstance(model, str) or not model.strip():
            raise ConfigurationError(f"model must be a non-empty name, not {model!r}")
        if not self._check_models or model in self._known:
            return
        listed = await self.backend.models()
        if listed is not None and model not in listed:
            raise ModelNotFoundError(model, sorted(listed))
        self._known.add(model)

    async def tokenizer_path(self, model: str) -> str | None:
        return self._tokenizer_dir

    async def tokenizer(self, model: str) -> Tokenizer:
        """The local tokenizer folder given as ``tokenizer`` (a batch API has no tokenizer of
        its own to ask), with ``model``'s context where the API lists it.

        Raises:
            ConfigurationError: no ``tokenizer`` was given, or this API cannot score (it
                serves chat completions only).
        """
        if Endpoint.completions not in self.endpoints:
            raise ConfigurationError(
                f"{self.backend.name} cannot score: it serves {Endpoint.chat_completions.value} "
                "only; scoring (log-likelihoods, lm-eval) needs /v1/completions, which "
                "batch-api (an OpenAI-shaped Batch API, a batchclient serve), remote, vllm "
                "and ray serve"
            )
        if self._tokenizer_dir is None:
            raise ConfigurationError(
                "scoring text needs the model's tokenizer: pass tokenizer=<local folder with "
                "the model's tokenizer files> (or --tokenizer); or give the requests as token ids"
            )
        known = self._tokenizers.get(model)
        if known is None:
            limit = await self.backend.context_length(model)
            known = await to_thread.run_sync(local_tokenizer, self._tokenizer_dir, limit)
            self._tokenizers[model] = known
        return known

    async def execute(self, request: Request) -> Result:
        """``request`` as a one-request remote batch (not durable), for code that only knows
        the ``Provider`` interface: correct, but each request waits for its own batch."""
        line = RequestLine(seq=0, line=1, custom_id="0", body=request.body)
        endpoint = request.endpoint.value
        data = self.backend.encode(line, endpoint)
        if isinstance(data, Result):
            return data
        with tempfile.TemporaryDirectory(prefix="batchclient-") as tmp:  # mode 0700
            path = Path(tmp, "request.jsonl")
            await anyio.Path(path).write_bytes(data)
            try:
                result = await self._one(path, endpoint, self.backend.wire_id(line))
                if request.endpoint is Endpoint.embeddings:
                    result = as_requested(request.body, result)
                return result
            except ApiError as exc:
                unreached = exc.status is None
                code = ErrorCode.endpoint_unavailable if unreached else ErrorCode.server_error
                return failed(code, str(exc), status_code=exc.status)

    async def _one(self, path: Path, endpoint: str, wire: str) -> Result:
        backend, dest = self.backend, path.with_suffix(".results")
        upload = await self.retrier.call(lambda: backend.upload(path, 1, {}))
        # one attempt: a create is not idempotent, and nothing records this one to look for
        remote_id = await backend.submit(upload, path, endpoint, self.completion_window, {})
        while True:
            state = await self.retrier.call(lambda: backend.poll(remote_id), forever=True)
            if state.ended:
                break
            await anyio.sleep(self.options["poll_interval_s"])
        await self.retrier.call(lambda: backend.results(remote_id, dest))
        result = await to_thread.run_sync(one_result, dest, wire)
        if result is not None:
            return result
        code = ErrorCode.batch_expired if state.partial else ErrorCode.bad_upstream_response
        return failed(code, f"the remote batch {remote_id} ended without running the request")


def _seconds(window: str) -> float:
    try:
        return parse_window(window)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def _check(options: RemoteBatchOptions) -> None:
    """Refuse values no batch API takes."""
    if options["poll_interval_s"] <= 0 or options["timeout_s"] <= 0:
        raise ConfigurationError("poll_interval_s and timeout_s must be > 0 seconds")
    if options["max_retries"] < 0 or options["expiry_grace_s"] < 0:
        raise ConfigurationError("max_retries and expiry_grace_s must be >= 0")
    if options["max_attempts"] < 1:
        raise ConfigurationError("max_attempts must be >= 1")
    lines, size = options["max_lines"], options["max_bytes"]
    if (lines is not None and lines < 1) or (size is not None and size < 1024):
        raise ConfigurationError("max_lines must be >= 1 and max_bytes >= 1024")
    if options["completion_window"] is not None:
        _seconds(options["completion_window"])
