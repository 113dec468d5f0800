"""Anthropic Message Batches as a :class:`~._backend.RemoteBatchBackend`, on the ``anthropic``
SDK with its own retries off (guide: ``docs/batch-api.md``, "Anthropic Message Batches").

The wire (Anthropic API reference, Message Batches): ``POST /v1/messages/batches`` with inline
``requests: [{custom_id, params}]``, ``GET /v1/messages/batches/{id}`` (``processing_status``,
``request_counts``), the results JSONL once it has ended (``result.type`` ``succeeded`` /
``errored`` / ``canceled`` / ``expired``, in no guaranteed order), ``POST .../{id}/cancel`` and
``GET /v1/messages/batches`` (newest first). Caps: 100,000 requests or 256 MB per batch; parts
are filled to 95% of each. ``anthropic-version`` is ``2023-06-01`` unless ``api_version`` says
otherwise: the SDK's own ``2026-10-21`` refuses ``temperature``, which every batchclient call
sends (:mod:`._anthropic_translate`).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import orjson

from .._core.ledger import Billing
from .._core.request import Result, failed
from ..errors import ConfigurationError, ErrorCode
from ..jobs._validate import RequestLine
from ..types import Endpoint
from ._anthropic_cache import mark_shared_prefixes, min_tokens
from ._anthropic_translate import error_of, to_completion, to_params
from ._backend import RemoteState, check_header_value, error_line, ok_line, unrun_line
from ._options import AnthropicBatchOptions
from ._parts import Limits, private_file
from ._retry import ApiError

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic

T = TypeVar("T")

MAX_REQUESTS, MAX_BYTES = 100_000, 256_000_000  # Anthropic's caps for one Message Batch
_HTTP_LIBRARIES = ("httpx", "httpx2", "httpcore")
_FIND_SLACK_S = 120.0  # clocks of client and provider disagree a little


class AnthropicBackend:
    """The Message Batches wire, one attempt per call. Arguments as
    :class:`~batchclient.AnthropicBatchInference`: ``api_key`` None reads
    ``$ANTHROPIC_API_KEY``, ``base_url`` None ``$ANTHROPIC_BASE_URL``, else Anthropic's own;
    ``max_lines`` / ``max_bytes`` None: 95% of Anthropic's caps.

    Raises:
        ConfigurationError: no key, a bad URL, header or limit, or the SDK not installed.
    """

    name = "anthropic-batch"
    endpoints = frozenset({Endpoint.chat_completions})

    def __init__(
        self, base_url: str | None, api_key: str | None, options: AnthropicBatchOptions
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
        if options["max_tokens"] < 1:
            raise ConfigurationError("max_tokens must be >= 1")
        lines = options["max_lines"] or MAX_REQUESTS * 95 // 100
        size = options["max_bytes"] or MAX_BYTES * 95 // 100
        if not 1 <= lines <= MAX_REQUESTS:
            raise ConfigurationError(f"max_lines must be in 1..{MAX_REQUESTS}")
        if not 1024 <= size <= MAX_BYTES - 1024:
            raise ConfigurationError(f"max_bytes must be in 1024..{MAX_BYTES - 1024}")
        self.api_key = check_header_value("api_key", key)
        self.base_url = url.rstrip("/")
        self.api_version = check_header_value("api_version", options["api_version"])
        self.max_tokens = options["max_tokens"]
        caching = options["prompt_caching"]
        if caching not in (True, False, "auto") or type(caching) not in (bool, str):
            raise ConfigurationError(
                f"prompt_caching must be 'auto', True or False, not {caching!r}"
            )
        self.prompt_caching = caching is not False
        self.timeout_s = options["timeout_s"]
        headers = options["headers"] or {}
        self.headers = {k: check_header_value(f"header {k}", v) for k, v in headers.items()}
        self.retry_after_cap_s = options["retry"].retry_after_cap_s
        self.limits = Limits(lines, size)
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
                timeout=self.timeout_s,
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
            retry_after = exc.response.headers.get("retry-after")
            raise ApiError.http(
                what, exc.status_code, exc.message, retry_after, self.retry_after_cap_s
            ) from None
        except anthropic.APIResponseValidationError as exc:
            raise ApiError(
                f"{what}: malformed answer: {exc}"[:500], status=200, transient=True
            ) from None
        except Exception as exc:
            # a connection failure, a batch without results_url yet, or a results stream cut
            # short (the SDK's HTTP library raises its own errors while a body is read)
            sdk = isinstance(exc, anthropic.AnthropicError | OSError)
            if not sdk and type(exc).__module__.split(".")[0] not in _HTTP_LIBRARIES:
                raise
            raise ApiError(f"{what}: {type(exc).__name__}: {exc}"[:500], transient=True) from None

    async def models(self) -> set[str] | None:
        return None  # not asked: one more call per batch, and a key may be scoped to some

    async def context_length(self, model: str) -> int | None:
        return None

    def billing(self, model: str) -> Billing:
        """The batch tier; prefixes cached from the model's minimum when they are marked
        (:mod:`._anthropic_cache`), cache writes billed apart."""
        return Billing("batch", min_tokens(model) if self.prompt_caching else None, True)

    def wire_id(self, line: RequestLine) -> str:
        return str(line.seq)  # custom_id may be any string; Anthropic's must match an id rule

    def encode(self, line: RequestLine, endpoint: str) -> bytes | Result:
        if endpoint != Endpoint.chat_completions.value:
            return failed(
                ErrorCode.invalid_request,
                f"Anthropic Message Batches serve only {Endpoint.chat_completions.value}",
                status_code=400,
            )
        params = to_params(line.body, max_tokens=self.max_tokens, api_version=self.api_version)
        if isinstance(params, Result):
            return params
        return orjson.dumps({"custom_id": self.wire_id(line), "params": params}) + b"\n"

    async def upload(self, path: Path, lines: int, marks: dict[str, str]) -> str | None:
        return None  # a create carries its requests

    async def submit(
        self, upload: str | None, path: Path, endpoint: str, window: str, marks: dict[str, str]
    ) -> str:
        from anthropic.types.messages import MessageBatch

        data = await anyio.Path(path).read_bytes()
        lines = data.splitlines()
        del data
        if self.prompt_caching and len(lines) > 1:
            lines = await anyio.to_thread.run_sync(_with_cache_marks, lines)
        body = b'{"requests":[' + b",".join(lines) + b"]}"
        del lines
        batch = await self._call(
            "POST /v1/messages/batches",
            lambda: self._sdk().post(
                "/v1/messages/batches",
                cast_to=MessageBatch,
                content=body,
                options={"headers": {"Content-Type": "application/json"}},
            ),
        )
        self._claimed.add(batch.id)
        return batch.id

    async def find(
        self, upload: str | None, marks: dict[str, str], lines: int, since: float
    ) -> str | None:
        """Message Batches carry no labels: the one batch of ``lines`` requests created since
        ``since`` (newest first, a few pages) that this process did not make or adopt for
        another part; None when there is none or more than one."""
        found: list[str] = []

        async def scan() -> None:
            page = await self._sdk().messages.batches.list(limit=100)
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
        batch = await self._call(
            f"GET /v1/messages/batches/{remote_id}",
            lambda: self._sdk().messages.batches.retrieve(remote_id),
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
        async def read() -> None:
            stream = self._sdk().messages.batches.with_streaming_response.results(remote_id)
            async with stream as response:
                with private_file(dest) as out:
                    async for raw in response.iter_lines():
                        if raw.strip():
                            out.write(_normalised(raw))

        await self._call(f"GET /v1/messages/batches/{remote_id}/results", read)

    async def cancel(self, remote_id: str) -> None:
        await self._call(
            f"POST /v1/messages/batches/{remote_id}/cancel",
            lambda: self._sdk().messages.batches.cancel(remote_id),
        )


def _with_cache_marks(lines: list[bytes]) -> list[bytes]:
    """A part's request lines with prompt-cache marks on their shared prefixes
    (:mod:`._anthropic_cache`); as they were when none is shared or the marks would take the
    create over Anthropic's size cap."""
    requests = [orjson.loads(line) for line in lines]
    if not mark_shared_prefixes(requests):
        return lines
    marked = [orjson.dumps(request) for request in requests]
    if sum(map(len, marked)) + len(marked) + 16 > MAX_BYTES:
        return lines
    return marked


def _normalised(raw: str) -> bytes:
    """One Anthropic results line as a normalised result line: a malformed one is its own
    request's ``bad_upstream_response``, the others keep theirs."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return b""  # no custom_id to give it: its request ends as a missing result
    wire = obj.get("custom_id") if isinstance(obj, dict) else None
    if not isinstance(wire, str):
        return b""
    result = obj.get("result")
    kind = result.get("type") if isinstance(result, dict) else None
    if kind == "succeeded" and isinstance(result, dict) and isinstance(result.get("message"), dict):
        message = result["message"]
        request_id = message.get("id")
        translate = partial(to_completion, message)
        return ok_line(wire, translate, request_id if isinstance(request_id, str) else None)
    if kind == "errored" and isinstance(result, dict):
        code, message_text, retryable = error_of(result.get("error"))
        return error_line(wire, code, message_text, retryable=retryable)
    if kind == "expired":
        return unrun_line(wire, "expired")
    if kind == "canceled":
        return unrun_line(wire, "cancelled")
    return error_line(wire, ErrorCode.bad_upstream_response.value, f"unknown result type {kind!r}")
