"""``AnthropicBatchInference``: the protocol over Anthropic Message Batches, on the official
``anthropic`` SDK (the ``anthropic`` extra). Guide: ``docs/batch-api.md``.

The wire (Anthropic API reference, Message Batches): ``POST /v1/messages/batches`` with inline
``requests: [{custom_id, params}]``, ``GET /v1/messages/batches/{id}`` (``processing_status``
``in_progress`` / ``canceling`` / ``ended``, ``request_counts``), the results as JSONL from the
batch's ``results_url`` once it has ended (``result.type`` ``succeeded`` / ``errored`` /
``canceled`` / ``expired``, in no guaranteed order), ``POST .../{id}/cancel`` and
``GET /v1/messages/batches`` (newest first). Caps: 100,000 requests or 256 MB per batch; parts
are filled to 95% of each.

``anthropic-version``: the SDK (2.x) sends ``2026-10-21``, under which ``temperature``,
``top_p`` and ``top_k`` do not exist (one of them refuses the whole create). Every batchclient
call carries ``temperature`` (greedy sampling is ``temperature: 0``), so this client sends
``2023-06-01`` by default, which accepts them; with ``api_version="2026-10-21"`` a request
carrying one is a per-item ``unsupported_parameter`` error and the rest of the batch goes.

The SDK's own retries are off (``max_retries=0``): every retry is this package's, so a 429's
or 529's ``Retry-After`` reaches the backoff.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, Unpack

import anyio
import orjson

from .._core.client import BatchClient
from .._core.provider import Provider
from .._core.request import Result, failed
from .._routing.retry import parse_retry_after
from .._routing.settings import RetryPolicy
from ..errors import ConfigurationError, ErrorCode
from ..jobs import RequestLine
from ..types import Endpoint
from ._anthropic_translate import VERSION_WITH_SAMPLING, error_of, to_completion, to_params
from ._api import _TRANSIENT, check_header_value
from ._backend import RemoteState, error_line, ok_line, unrun_line, wire_id
from ._backend_provider import BackendProvider
from ._backend_runner import BackendRunner
from ._client import RemoteJobClient
from ._parts import Limits, private_file
from ._retry import ApiError, Retrier
from ._runner import RunSettings

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic

T = TypeVar("T")

ANTHROPIC_MAX_REQUESTS = 100_000
ANTHROPIC_MAX_BYTES = 256_000_000
"""Anthropic's caps for one Message Batch: 100,000 requests, 256 MB."""
ANTHROPIC_LINES = ANTHROPIC_MAX_REQUESTS * 95 // 100
ANTHROPIC_BYTES = ANTHROPIC_MAX_BYTES * 95 // 100
SDK_VERSION_WITHOUT_SAMPLING = "2026-10-21"
_SAMPLING_VERSIONS = frozenset({"2023-01-01", "2023-06-01"})
_FIND_SLACK_S = 120.0  # clocks of client and provider disagree a little


class AnthropicBatchOptions(TypedDict, total=False):
    """The keyword options of :class:`AnthropicBatchProvider` (documented on
    :class:`~batchclient.AnthropicBatchInference`)."""

    base_url: str | None
    api_version: str
    max_tokens: int
    poll_interval: float
    max_retries: int
    timeout: float
    retry: RetryPolicy
    headers: dict[str, str] | None


class AnthropicBackend:
    """The Message Batches wire, one attempt per call (see :class:`RemoteBatchBackend`)."""

    def __init__(
        self,
        api_key: str,
        base_url: str,
        *,
        api_version: str,
        max_tokens: int,
        poll_interval: float,
        max_retries: int,
        timeout: float,
        retry: RetryPolicy,
        headers: dict[str, str],
    ) -> None:
        self.api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.api_version = api_version
        self.max_tokens = max_tokens
        self.sampling = api_version in _SAMPLING_VERSIONS
        self.poll_interval_s = poll_interval
        self.timeout = timeout
        self.headers = headers
        self.retrier = Retrier(max_retries, retry)
        self.limits = Limits(ANTHROPIC_LINES, ANTHROPIC_BYTES)
        self._client: AsyncAnthropic | None = None
        self._claimed: set[str] = set()  # batches this process made or adopted: never found

    def identity(self) -> dict[str, Any]:
        return {"provider": "anthropic-batch", "base_url": self.base_url}

    async def start(self) -> None:
        if self._client is None:
            from anthropic import AsyncAnthropic

            self._client = AsyncAnthropic(
                api_key=self.api_key,
                base_url=self.base_url,
                max_retries=0,
                timeout=self.timeout,
                default_headers={**self.headers, "anthropic-version": self.api_version},
            )

    async def stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def _sdk(self) -> AsyncAnthropic:
        if self._client is None:
            raise ConfigurationError("the Anthropic client is not open")
        return self._client

    async def _call(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """One SDK call; its failures as :class:`ApiError`."""
        import anthropic

        try:
            return await fn()
        except anthropic.APIStatusError as exc:
            status = exc.status_code
            wait = parse_retry_after(
                exc.response.headers.get("retry-after"),
                cap_s=self.retrier.retry.retry_after_cap_s,
            )
            raise ApiError(
                f"{what}: HTTP {status}: {exc.message}"[:500],
                status=status,
                transient=status in _TRANSIENT,
                retry_after_s=wait,
            ) from None
        except anthropic.APIResponseValidationError as exc:
            raise ApiError(
                f"{what}: malformed answer: {exc}"[:500], status=200, transient=True
            ) from None
        except anthropic.APIConnectionError as exc:
            raise ApiError(f"{what}: {type(exc).__name__}: {exc}", transient=True) from None
        except (anthropic.AnthropicError, OSError) as exc:
            # e.g. a batch without results_url yet, or a results stream cut short (the SDK's
            # HTTP library raises its own errors while a streamed body is read)
            raise ApiError(f"{what}: {type(exc).__name__}: {exc}"[:500], transient=True) from None
        except Exception as exc:
            if type(exc).__module__.split(".")[0] not in ("httpx", "httpx2", "httpcore"):
                raise
            raise ApiError(f"{what}: {type(exc).__name__}: {exc}"[:500], transient=True) from None

    def encode(self, line: RequestLine, endpoint: str) -> bytes | Result:
        if endpoint != Endpoint.chat_completions.value:
            return failed(
                ErrorCode.invalid_request,
                f"Anthropic Message Batches serve only {Endpoint.chat_completions.value}",
                status_code=400,
            )
        params = to_params(
            line.body, max_tokens=self.max_tokens, sampling=self.sampling,
            api_version=self.api_version,
        )  # fmt: skip
        if isinstance(params, Result):
            return params
        return orjson.dumps({"custom_id": wire_id(line), "params": params}) + b"\n"

    async def submit(self, path: Path, lines: int, marks: dict[str, str]) -> str:
        from anthropic.types.messages import MessageBatch

        data = await anyio.Path(path).read_bytes()
        body = b'{"requests":[' + b",".join(data.splitlines()) + b"]}"
        del data
        client = self._sdk()
        batch = await self._call(
            "POST /v1/messages/batches",
            lambda: client.post(
                "/v1/messages/batches",
                cast_to=MessageBatch,
                content=body,
                options={"headers": {"Content-Type": "application/json"}},
            ),
        )
        self._claimed.add(batch.id)
        return batch.id

    async def find(self, marks: dict[str, str], lines: int, since: float) -> str | None:
        """Message Batches carry no labels: the one batch of ``lines`` requests created since
        ``since`` (newest first, a few pages) that this process did not make or adopt for
        another part; None when there is none or more than one."""
        client = self._sdk()
        found: list[str] = []

        async def scan() -> None:
            page = await client.messages.batches.list(limit=100)
            for _ in range(5):
                for batch in page.data:
                    if batch.created_at.timestamp() < since - _FIND_SLACK_S:
                        return
                    c = batch.request_counts
                    total = c.processing + c.succeeded + c.errored + c.canceled + c.expired
                    if total == lines and batch.id not in self._claimed:
                        found.append(batch.id)
                if not page.has_next_page():
                    return
                page = await page.get_next_page()

        await self._call("GET /v1/messages/batches", scan)
        if len(found) != 1:
            return None
        self._claimed.add(found[0])
        return found[0]

    async def poll(self, remote_id: str) -> RemoteState:
        client = self._sdk()
        batch = await self._call(
            f"GET /v1/messages/batches/{remote_id}",
            lambda: client.messages.batches.retrieve(remote_id),
        )
        c = batch.request_counts
        status = batch.processing_status
        return RemoteState(
            status="cancelling" if status == "canceling" else status,
            completed=c.succeeded,
            failed=c.errored + c.expired + c.canceled,
            cancelled=batch.cancel_initiated_at is not None,
        )

    async def results(self, remote_id: str, dest: Path) -> None:
        client = self._sdk()

        async def read() -> None:
            stream = client.messages.batches.with_streaming_response.results(remote_id)
            async with stream as response:
                with private_file(dest) as out:
                    async for raw in response.iter_lines():
                        if raw.strip():
                            out.write(_normalised(raw))

        await self._call(f"GET /v1/messages/batches/{remote_id}/results", read)

    async def cancel(self, remote_id: str) -> None:
        client = self._sdk()
        await self._call(
            f"POST /v1/messages/batches/{remote_id}/cancel",
            lambda: client.messages.batches.cancel(remote_id),
        )


def _normalised(raw: str) -> bytes:
    """One Anthropic results line as a normalised result line."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return b""  # no custom_id to give it: its request ends as a missing result
    wire = str(obj.get("custom_id", "")) if isinstance(obj, dict) else ""
    result = obj.get("result") if isinstance(obj, dict) else None
    kind = result.get("type") if isinstance(result, dict) else None
    if kind == "succeeded" and isinstance(result, dict) and isinstance(result.get("message"), dict):
        message = result["message"]
        return ok_line(wire, to_completion(message), message.get("id"))
    if kind == "errored" and isinstance(result, dict):
        code, message_text, retryable = error_of(result.get("error"))
        return error_line(wire, code, message_text, retryable=retryable)
    if kind == "expired":
        return unrun_line(wire, "expired")
    if kind == "canceled":
        return unrun_line(wire, "cancelled")
    return error_line(wire, ErrorCode.bad_upstream_response.value, f"unknown result type {kind!r}")


class AnthropicBatchProvider(BackendProvider):
    """Anthropic Message Batches as a :class:`~batchclient.Provider`. Arguments as
    :class:`~batchclient.AnthropicBatchInference`."""

    backend: AnthropicBackend

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        api_version: str = VERSION_WITH_SAMPLING,
        max_tokens: int = 4096,
        poll_interval: float = 30.0,
        max_retries: int = 8,
        timeout: float = 600.0,
        retry: RetryPolicy = RetryPolicy(),
        headers: dict[str, str] | None = None,
    ) -> None:
        if importlib.util.find_spec("anthropic") is None:  # importing it takes seconds
            raise ConfigurationError(
                "AnthropicBatchInference needs the anthropic SDK: "
                "pip install 'batchclient[anthropic]'"
            )
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ConfigurationError("no Anthropic API key: pass api_key or set ANTHROPIC_API_KEY")
        url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or "https://api.anthropic.com"
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"base_url {url!r} is not an http(s) URL")
        if poll_interval <= 0 or max_tokens < 1:
            raise ConfigurationError("poll_interval must be > 0 seconds and max_tokens >= 1")
        if max_retries < 0 or timeout <= 0:
            raise ConfigurationError("max_retries must be >= 0 and timeout > 0 seconds")
        check_header_value("api_key", key)
        extra = {k: check_header_value(f"header {k}", v) for k, v in (headers or {}).items()}
        backend = AnthropicBackend(
            key, url, api_version=check_header_value("api_version", api_version),
            max_tokens=max_tokens, poll_interval=poll_interval, max_retries=max_retries,
            timeout=timeout, retry=retry, headers=extra,
        )  # fmt: skip
        super().__init__(backend)
        self.base_url = backend.base_url
        self.poll_interval = poll_interval


class AnthropicBatchInference(RemoteJobClient):
    """Batch inference through Anthropic Message Batches (half the price of live calls). Use
    as ``async with``. Requests stay OpenAI chat bodies; answers come back as OpenAI
    ``chat.completion`` bodies (translation: ``docs/batch-api.md``).

    Args (every one after ``api_key`` keyword-only; ``base_url`` .. ``headers`` are
    :class:`AnthropicBatchOptions`, the provider's):
        api_key: the API key (default ``$ANTHROPIC_API_KEY``).
        base_url: the API root (default ``$ANTHROPIC_BASE_URL`` or
            ``https://api.anthropic.com``): a gateway, or a test stub.
        api_version: the ``anthropic-version`` header (default ``"2023-06-01"``, which accepts
            ``temperature`` / ``top_p`` / ``top_k``); under ``"2026-10-21"`` (the SDK's own)
            a request carrying one is an ``unsupported_parameter`` item.
        max_tokens: ``max_tokens`` of a request that sets none (Anthropic requires one;
            default 4096).
        poll_interval: seconds between two polls of a remote batch (default 30).
        max_attempts: the most remote batches one request is sent in: expired, cancelled (by
            someone else) and retryably errored requests (overloaded, api, rate-limit and
            timeout errors) are resubmitted until then (default 3).
        max_lines: the most requests in one remote batch (default 95,000: 95% of 100,000).
        max_bytes: the largest remote batch's requests in bytes (default 95% of 256 MB); a
            single request above it is an ``invalid_request`` item.
        on_expired: a provider (or a client: its provider) that re-runs, live, the requests
            still not run after ``max_attempts``; None (default): ``batch_expired`` items.
        max_retries: retries of a failed create, cancel or results download (connection error,
            timeout, 408/409/429/5xx/529; default 8). Polls retry without limit.
        timeout: seconds for one HTTP call (default 600).
        retry: backoff between retries and the longest ``Retry-After`` honoured.
        headers: extra HTTP headers for every call.
        expiry_grace_s: how long past the local job's 24 h window (its remote batches end by
            then) they are still waited for before they are cancelled (default 600 s).
        state_dir: where files, jobs, remote batch ids and results are kept.

    Raises:
        ConfigurationError: a bad argument, no API key, or the SDK not installed.
    """

    provider: AnthropicBatchProvider

    def __init__(
        self,
        api_key: str | None = None,
        *,
        max_attempts: int = 3,
        max_lines: int = ANTHROPIC_LINES,
        max_bytes: int = ANTHROPIC_BYTES,
        on_expired: Provider | BatchClient | None = None,
        expiry_grace_s: float = 600.0,
        state_dir: str | os.PathLike[str] | None = None,
        **options: Unpack[AnthropicBatchOptions],
    ) -> None:
        if max_attempts < 1:
            raise ConfigurationError("max_attempts must be >= 1")
        if not 1 <= max_lines <= ANTHROPIC_MAX_REQUESTS:
            raise ConfigurationError(f"max_lines must be in 1..{ANTHROPIC_MAX_REQUESTS}")
        if not 1024 <= max_bytes <= ANTHROPIC_MAX_BYTES - 1024:
            raise ConfigurationError(f"max_bytes must be in 1024..{ANTHROPIC_MAX_BYTES - 1024}")
        if expiry_grace_s < 0:
            raise ConfigurationError("expiry_grace_s must be >= 0 seconds")
        provider = AnthropicBatchProvider(api_key, **options)
        backend = provider.backend
        backend.limits = Limits(max_lines, max_bytes)
        live = on_expired.provider if isinstance(on_expired, BatchClient) else on_expired
        settings = RunSettings(backend.limits, backend.poll_interval_s, expiry_grace_s)
        super().__init__(
            provider,
            BackendRunner(backend, provider, settings, max_attempts, live),
            completion_window="24h",
            poll_interval=backend.poll_interval_s,
            on_expired=live,
            state_dir=state_dir,
        )
        self.max_attempts = max_attempts

    @property
    def base_url(self) -> str:
        return self.provider.base_url


__all__ = [
    "ANTHROPIC_MAX_BYTES",
    "ANTHROPIC_MAX_REQUESTS",
    "SDK_VERSION_WITHOUT_SAMPLING",
    "AnthropicBatchInference",
    "AnthropicBatchOptions",
    "AnthropicBatchProvider",
]
