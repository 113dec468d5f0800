"""``RemoteBatchInference``: concurrency-limited fan-out to an OpenAI-compatible endpoint.

One ``POST {base_url}/chat/completions`` per conversation, at most ``max_concurrency`` in flight
as a sliding window (a slow request holds one slot, never a chunk), retried by the policy in
:mod:`._retry`. HTTP goes through one ``aiohttp`` session with lean JSON handling: the openai
SDK's per-request cost caps a client at a few hundred requests/s on one core (GUIDE.md), and its
hidden retries would hide throttling from our own policy. ``docs/design.md`` says more.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import aiohttp
import anyio
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from .._client import BaseBatchClient
from .._wire import ChatRequest, ChatResult, failed, http_error
from ..errors import ConfigurationError, ErrorCode, ModelNotFoundError
from ._retry import RETRYABLE_STATUS, RetryableFailure, RetryWait, parse_retry_after

__all__ = ["RemoteBatchInference"]


class RemoteBatchInference(BaseBatchClient):
    """Batch inference against an OpenAI-compatible ``/v1/chat/completions`` endpoint (a vLLM
    server, OpenAI, a llama.cpp server, ...). Use as ``async with``.

    Args:
        base_url: the API root, ending in ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``).
        api_key: sent as ``Authorization: Bearer <api_key>``; None sends no header.
        max_concurrency: requests in flight at once (default 64).
        max_retries: retries after the first attempt for transient failures (connect errors,
            timeouts, 408/409/429/5xx); default 4. 400/401/403/404/422 are never retried.
        timeout: seconds one attempt may take, counted from when it is sent (never from when
            it was queued); default 600.
        retry_after_cap_s: the longest ``Retry-After`` honoured, in seconds (default 60).
        backoff_initial_s, backoff_max_s: exponential backoff without ``Retry-After``.
        headers: extra HTTP headers for every request.
        check_model: ask ``GET /models`` once per model and raise ``ModelNotFoundError`` for a
            model the endpoint does not list (skipped if the endpoint cannot list models).
        state_dir: where files, jobs and results are kept (default ``$BATCHCLIENT_STATE_DIR`` or
            the user data directory); jobs there resume with a client on the same ``base_url``.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        max_concurrency: int = 64,
        max_retries: int = 4,
        timeout: float = 600.0,
        retry_after_cap_s: float = 60.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        headers: dict[str, str] | None = None,
        check_model: bool = True,
        state_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(state_dir=state_dir)
        if max_concurrency < 1:
            raise ConfigurationError("max_concurrency must be >= 1")
        if max_retries < 0:
            raise ConfigurationError("max_retries must be >= 0")
        if timeout <= 0:
            raise ConfigurationError("timeout must be > 0 seconds")
        self.base_url = base_url.rstrip("/")
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.timeout = timeout
        self.retry_after_cap_s = retry_after_cap_s
        self._wait = RetryWait(initial_s=backoff_initial_s, max_s=backoff_max_s)
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._check_models = check_model
        self._known_models: dict[str, bool] = {}
        self._session: aiohttp.ClientSession | None = None
        self._limiter = anyio.CapacityLimiter(max_concurrency)

    # ------------------------------------------------------------------ lifecycle

    async def _start(self) -> None:
        # limit=0: the connector never queues; our limiter is the only queue, so the timeout
        # of an attempt starts when it is really sent.
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector, headers=self._headers, json_serialize=json.dumps
        )

    async def _stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _window(self) -> int:
        return self.max_concurrency

    def _job_identity(self) -> dict[str, Any]:
        return {"provider": "remote", "base_url": self.base_url}

    def _concurrency_limit(self) -> int | None:
        return int(self._limiter.total_tokens)

    # ------------------------------------------------------------------ model check

    async def _check_model(self, model: str) -> None:
        if not self._check_models or model in self._known_models:
            return
        listed = await self._list_models()
        if listed is None:  # the endpoint cannot list models: let each request find out
            self._known_models[model] = True
            return
        if model not in listed:
            raise ModelNotFoundError(model, sorted(listed))
        self._known_models[model] = True

    async def _list_models(self) -> set[str] | None:
        assert self._session is not None
        try:
            async with self._session.get(
                f"{self.base_url}/models", timeout=aiohttp.ClientTimeout(total=10)
            ) as resp:
                if resp.status != 200:
                    return None
                data = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        entries = data.get("data") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            return None
        return {str(e.get("id")) for e in entries if isinstance(e, dict)}

    # ------------------------------------------------------------------ one request

    async def _execute(self, request: ChatRequest) -> ChatResult:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception_type(RetryableFailure),
            reraise=True,
        )
        attempts = 0
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    async with self._limiter:
                        result = await self._attempt(request.body)
                    result.attempts = attempts
                    return result
        except RetryableFailure as last:
            last.result.attempts = attempts
            return last.result
        raise AssertionError("unreachable: tenacity either returns or reraises")

    async def _attempt(self, body: dict[str, Any]) -> ChatResult:
        """Send once. Returns the final result, or raises ``RetryableFailure``."""
        assert self._session is not None
        started = time.perf_counter()
        try:
            async with self._session.post(
                f"{self.base_url}/chat/completions",
                data=json.dumps(body),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as resp:
                raw = await resp.read()
                status = resp.status
                retry_after = resp.headers.get("Retry-After")
                request_id = resp.headers.get("x-request-id")
        except TimeoutError:
            raise RetryableFailure(
                failed(ErrorCode.timeout, f"no answer within {self.timeout:g} s of sending")
            ) from None
        except aiohttp.ClientError as exc:
            raise RetryableFailure(
                failed(ErrorCode.connection_error, f"{type(exc).__name__}: {exc}")
            ) from None
        latency = time.perf_counter() - started
        if 200 <= status < 300:
            result = _parse_success(status, raw)
            result.latency_s = latency
            result.request_id = request_id
            return result
        result = http_error(status, raw)
        result.latency_s = latency
        result.request_id = request_id
        if status in RETRYABLE_STATUS:
            wait = parse_retry_after(retry_after, cap_s=self.retry_after_cap_s)
            raise RetryableFailure(result, wait)
        return result


def _parse_success(status: int, raw: bytes) -> ChatResult:
    """A 2xx answer: a ChatCompletion object, or ``bad_upstream_response`` (never an empty
    success: peer lesson 14, case C14)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return _bad_upstream(status, f"answer is not JSON: {raw[:200]!r}")
    if not isinstance(body, dict):
        return _bad_upstream(status, f"answer is not a JSON object: {raw[:200]!r}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        upstream = body.get("error")
        detail = (upstream.get("message") if isinstance(upstream, dict) else upstream) or raw[
            :200
        ].decode("utf-8", "replace")
        return _bad_upstream(status, f"answer without choices: {detail}")
    return ChatResult(status_code=status, body=body)


def _bad_upstream(status: int, message: str) -> ChatResult:
    result = failed(ErrorCode.bad_upstream_response, message)
    assert result.error is not None
    result.error.status_code = status
    return result
