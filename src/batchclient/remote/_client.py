"""``RemoteProvider``: fan-out to one or more OpenAI-compatible endpoints, and
``RemoteBatchInference``, the client over it.

One ``POST {base_url}/chat/completions`` per conversation. Each attempt takes a slot on the
least-loaded usable (replica, model) lane (:mod:`._endpoints`), whose limit adapts to
throttling (:mod:`._adaptive`), waits for the replica's rpm/tpm buckets (:mod:`._rates`), and is
sent over a keep-alive HTTP/1.1 pool (:mod:`._http`); failures are retried by the policy in
:mod:`._retry`. The per-request timeout starts when the request is sent, after every queue.
``docs/remote.md`` explains every knob and algorithm.
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from .._core.client import BatchClient
from .._core.decode import http_error
from .._core.provider import Provider
from .._core.request import Request, Result, failed
from .._tools import ToolRefusal, apply_to_body, mentions_tools, plan_tools
from ..errors import ConfigurationError, ErrorCode, ModelNotFoundError
from ._adaptive import AdaptiveSettings
from ._endpoints import Dispatcher, EndpointUnavailable, Lane, LaneStats, Replica
from ._http import HttpError, HttpTimeout, Pool
from ._rates import RateBuckets
from ._retry import (
    EJECTING_STATUS,
    RETRYABLE_STATUS,
    THROTTLE_STATUS,
    RetryableFailure,
    RetryWait,
    parse_retry_after,
)
from ._settings import AdaptiveConcurrency, Ejection, RateLimits, RetryPolicy, Timeouts
from ._structured import VllmProbe

__all__ = ["RemoteBatchInference", "RemoteEndpoint", "RemoteProvider"]


@dataclass(frozen=True)
class RemoteEndpoint:
    """One replica with its own limits; a plain URL string in ``base_url`` means "the client's
    defaults". ``url`` is the API root ending in ``/v1``; ``max_concurrency`` (requests in
    flight per model), ``rpm`` (requests per minute) and ``tpm`` (tokens per minute) override
    the client's values for this endpoint; None keeps them."""

    url: str
    max_concurrency: int | None = None
    rpm: float | None = None
    tpm: float | None = None


BaseUrl = str | RemoteEndpoint | Sequence[str | RemoteEndpoint]
"""One API root ending in ``/v1``, or a list of replicas serving the same models."""


class RemoteBatchInference(BatchClient):
    """Batch inference against OpenAI-compatible ``/v1/chat/completions`` endpoints (vLLM
    servers, OpenAI, llama.cpp servers, ...). Use as ``async with``.

    Args:
        base_url: the API root ending in ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``), or a list
            of replicas serving the same models (URLs or :class:`RemoteEndpoint`). Each request
            goes to the least-loaded healthy one.
        api_key: sent as ``Authorization: Bearer <api_key>``; None sends no header.
        max_concurrency: the most requests in flight per endpoint and model (default 64).
        max_retries: retries after the first attempt for transient failures (connection
            errors, timeouts, 408/409/429/5xx; default 4). 400/401/403/404/422 are never retried.
        timeout: seconds one attempt may take, counted from when it is sent (never from when it
            was queued); default 600.
        rpm, tpm: requests / tokens per minute per endpoint (default None: no limit); shared by
            every call and batch on this client. Token costs are estimated before sending and
            settled with the real ``usage``.
        adaptive: an :class:`AdaptiveConcurrency` (True, the default: its defaults) to adapt the
            in-flight limit to throttling; False for a fixed limit of ``max_concurrency``.
        retry: backoff and ``Retry-After`` handling (:class:`RetryPolicy`).
        rate_limits: the period of ``rpm``/``tpm`` and the initial output estimate
            (:class:`RateLimits`).
        ejection: when a failing replica is taken out, and for how long (:class:`Ejection`).
        timeouts: connect and model-listing timeouts (:class:`Timeouts`).
        headers: extra HTTP headers for every request.
        ssl_context: TLS settings for ``https://`` endpoints (default: the system's CAs).
        check_model: ask ``GET /models`` once per model and raise ``ModelNotFoundError`` for a
            model the endpoint does not list (skipped if the endpoint cannot list models).
        state_dir: where files, batches and results are kept (default
            ``$BATCHCLIENT_STATE_DIR`` or the user data directory); batches there resume with a
            client on the same ``base_url``.

    Raises:
        ConfigurationError: a bad argument (e.g. ``AdaptiveConcurrency(minimum=...)`` above
            ``max_concurrency``).
    """

    provider: RemoteProvider

    def __init__(
        self,
        base_url: BaseUrl,
        api_key: str | None = None,
        *,
        max_concurrency: int = 64,
        max_retries: int = 4,
        timeout: float = 600.0,
        rpm: float | None = None,
        tpm: float | None = None,
        adaptive: AdaptiveConcurrency | bool = True,
        retry: RetryPolicy = RetryPolicy(),
        rate_limits: RateLimits = RateLimits(),
        ejection: Ejection = Ejection(),
        timeouts: Timeouts = Timeouts(),
        headers: dict[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        check_model: bool = True,
        state_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        provider = RemoteProvider(
            base_url,
            api_key,
            max_concurrency=max_concurrency,
            max_retries=max_retries,
            timeout=timeout,
            rpm=rpm,
            tpm=tpm,
            adaptive=adaptive,
            retry=retry,
            rate_limits=rate_limits,
            ejection=ejection,
            timeouts=timeouts,
            headers=headers,
            ssl_context=ssl_context,
            check_model=check_model,
        )
        super().__init__(provider, state_dir=state_dir)

    @property
    def base_url(self) -> str:
        """The first endpoint's API root (without a trailing slash)."""
        return self.provider.base_url

    def endpoint_stats(self) -> list[LaneStats]:
        """Per (endpoint, model): current concurrency limit, requests sent, successes,
        throttles (429/503/529 answers), failures, limit cuts, ejected/paused state and the
        learned output-token estimate."""
        return self.provider.endpoint_stats()


class RemoteProvider(Provider):
    """The remote fan-out as a :class:`~batchclient.Provider` (for ``BatchClient``, the server
    and other providers). Arguments as :class:`RemoteBatchInference`, without ``state_dir``."""

    def __init__(
        self,
        base_url: BaseUrl,
        api_key: str | None = None,
        *,
        max_concurrency: int = 64,
        max_retries: int = 4,
        timeout: float = 600.0,
        rpm: float | None = None,
        tpm: float | None = None,
        adaptive: AdaptiveConcurrency | bool = True,
        retry: RetryPolicy = RetryPolicy(),
        rate_limits: RateLimits = RateLimits(),
        ejection: Ejection = Ejection(),
        timeouts: Timeouts = Timeouts(),
        headers: dict[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        check_model: bool = True,
    ) -> None:
        if max_concurrency < 1:
            raise ConfigurationError("max_concurrency must be >= 1")
        if max_retries < 0:
            raise ConfigurationError("max_retries must be >= 0")
        if timeout <= 0:
            raise ConfigurationError("timeout must be > 0 seconds")
        if ejection.after < 1 or ejection.duration_s < 0:
            raise ConfigurationError("Ejection needs after >= 1 and duration_s >= 0")
        for name, value in (("rpm", rpm), ("tpm", tpm), ("period_s", rate_limits.period_s)):
            if value is not None and value <= 0:
                raise ConfigurationError(f"{name} must be > 0")
        urls = [base_url] if isinstance(base_url, str | RemoteEndpoint) else list(base_url)
        if not urls:
            raise ConfigurationError("base_url: give at least one endpoint")
        self.endpoints_given = [
            u if isinstance(u, RemoteEndpoint) else RemoteEndpoint(u) for u in urls
        ]
        self.base_url = self.endpoints_given[0].url.rstrip("/")
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.timeout = timeout
        self._rpm, self._tpm = rpm, tpm
        self.adaptive = adaptive is not False
        self._adaptive = (
            adaptive if isinstance(adaptive, AdaptiveConcurrency) else AdaptiveConcurrency()
        )
        self.retry = retry
        self.rate_limits = rate_limits
        self.ejection = ejection
        self.timeouts = timeouts
        self._wait = RetryWait(initial_s=retry.backoff_initial_s, max_s=retry.backoff_max_s)
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._ssl_context = ssl_context
        self._check_models = check_model
        self._known_models: dict[str, bool] = {}
        self._vllm_probe = VllmProbe(timeouts.list_models_s)
        self._dispatcher = self._build_dispatcher()  # validates the settings now

    def _build_dispatcher(self) -> Dispatcher:
        built = []
        adaptive = self._adaptive
        for spec in self.endpoints_given:
            maximum = spec.max_concurrency or self.max_concurrency
            initial = adaptive.initial
            try:
                settings = AdaptiveSettings(
                    initial=min(16 if initial is None else initial, maximum),
                    minimum=min(adaptive.minimum, maximum),
                    maximum=maximum,
                    increase_ratio=adaptive.increase_ratio,
                    decrease_factor=adaptive.decrease_factor,
                    cooldown_s=adaptive.cooldown_s,
                )
                pool = Pool(
                    spec.url,
                    self._headers,
                    connect_timeout=self.timeouts.connect_s,
                    ssl_context=self._ssl_context,
                )
            except ValueError as exc:
                raise ConfigurationError(f"{spec.url}: {exc}") from None
            rates = RateBuckets(
                spec.rpm or self._rpm,
                spec.tpm or self._tpm,
                period_s=self.rate_limits.period_s,
                initial_output_tokens=self.rate_limits.initial_output_tokens,
            )
            built.append(Replica(spec.url.rstrip("/"), pool, rates, settings, self.adaptive))
        return Dispatcher(built, eject_after=self.ejection.after, eject_s=self.ejection.duration_s)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._dispatcher.close()
        self._dispatcher = self._build_dispatcher()

    async def stop(self) -> None:
        self._dispatcher.close()

    def window(self) -> int:
        return sum(ep.settings.maximum for ep in self._dispatcher.endpoints)

    def identity(self) -> dict[str, Any]:
        return {"provider": "remote", "base_url": self.base_url}

    def concurrency_limit(self) -> int | None:
        return self._dispatcher.concurrency_limit()

    def endpoint_stats(self) -> list[LaneStats]:
        """Per (endpoint, model): current concurrency limit, requests sent, successes,
        throttles (429/503/529 answers), failures, limit cuts, ejected/paused state and the
        learned output-token estimate."""
        return self._dispatcher.stats()

    # ------------------------------------------------------------------ model check

    async def check_model(self, model: str) -> None:
        if not self._check_models or model in self._known_models:
            return
        listed = await self._list_models()
        if listed is None:  # the endpoint cannot list models: let each request find out
            self._known_models[model] = True
            return
        if model not in listed:
            raise ModelNotFoundError(model, sorted(listed))
        self._known_models[model] = True

    async def models(self) -> list[str]:
        """The models the first endpoint that can list them lists (``GET /models``), sorted;
        empty when none can."""
        return sorted(await self._list_models() or ())

    async def _list_models(self) -> set[str] | None:
        """The models of the first endpoint that answers ``GET /models``, else None."""
        for ep in self._dispatcher.endpoints:
            try:
                resp = await ep.pool.request(
                    "GET", f"{ep.path}/models", timeout=self.timeouts.list_models_s
                )
                data = orjson.loads(resp.body) if resp.status == 200 else None
            except (HttpError, HttpTimeout, ValueError):
                continue
            entries = data.get("data") if isinstance(data, dict) else None
            if isinstance(entries, list):
                return {str(e.get("id")) for e in entries if isinstance(e, dict)}
        return None

    # ------------------------------------------------------------------ one request

    async def execute(self, request: Request) -> Result:
        body = request.body
        tools = None
        if request.tool_prompt_format is not None and mentions_tools(body):
            # tools in the prompt, read back here: the same formats as the inline provider
            try:
                body, tools = plan_tools(body, request.tool_prompt_format)
            except ToolRefusal as refusal:
                return failed(refusal.code, refusal.message, status_code=400, param=refusal.param)
        if body.get("structured_outputs") is not None:
            refused = await self._vllm_probe.grammar_refusal(self._dispatcher.endpoints)
            if refused is not None:
                return refused
        result = await self._send(body)
        if tools is not None and result.error is None and result.body is not None:
            apply_to_body(tools, result.body)
        return result

    async def _send(self, body: dict[str, Any]) -> Result:
        model = str(body.get("model"))
        data = orjson.dumps(body)
        try:  # the fast path: one attempt, no retry machinery
            return await self._attempt(model, body, data, None)
        except RetryableFailure as first:
            return await self._retry(model, body, data, first)

    async def _retry(
        self, model: str, body: dict[str, Any], data: bytes, first: RetryableFailure
    ) -> Result:
        replay = [first]  # tenacity's first attempt re-raises the failure we already had
        avoid = first.endpoint
        told_when = _told_when(first)  # the server said when to retry: pauses do not hold it
        attempts = 1
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=self._wait,
            retry=retry_if_exception_type(RetryableFailure),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    if replay:
                        raise replay.pop()
                    attempts += 1
                    try:
                        result = await self._attempt(model, body, data, avoid, told_when)
                    except RetryableFailure as again:
                        avoid = again.endpoint or avoid
                        told_when = _told_when(again)
                        raise
                    result.attempts = attempts
                    return result
        except RetryableFailure as last:
            last.result.attempts = attempts
            return last.result
        raise AssertionError("unreachable: tenacity either returns or reraises")

    async def _attempt(
        self,
        model: str,
        body: dict[str, Any],
        data: bytes,
        avoid: Replica | None,
        past_pause: bool = False,
    ) -> Result:
        """Send once. Returns the final result, or raises ``RetryableFailure``."""
        dispatcher = self._dispatcher
        lane = dispatcher.try_acquire(model, avoid, past_pause)
        if lane is None:
            try:
                lane = await dispatcher.acquire(model, avoid, past_pause)
            except EndpointUnavailable as exc:
                result = failed(ErrorCode.endpoint_unavailable, str(exc))
                raise RetryableFailure(
                    result, min(exc.wait_s, self.retry.retry_after_cap_s)
                ) from None
        ep = lane.endpoint
        try:
            rates = ep.rates
            cost = 0.0
            if rates.active:
                cost = rates.estimate(body)
                await rates.acquire(cost)  # before the clock starts: queueing is not sending
            lane.sent += 1
            sent_at = time.monotonic()
            try:
                resp = await ep.pool.request(
                    "POST", ep.path + "/chat/completions", data, timeout=self.timeout
                )
            except HttpTimeout:
                dispatcher.on_failure(lane, "timeout", connection=False)
                msg = f"no answer within {self.timeout:g} s of sending"
                raise RetryableFailure(failed(ErrorCode.timeout, msg), endpoint=ep) from None
            except HttpError as exc:
                dispatcher.on_failure(lane, str(exc), connection=True)
                result = failed(ErrorCode.connection_error, f"{ep.base_url}: {exc}")
                raise RetryableFailure(result, endpoint=ep) from None
            return self._outcome(lane, resp.status, resp.headers, resp.body, sent_at, cost)
        finally:
            dispatcher.release(lane)

    def _outcome(
        self,
        lane: Lane,
        status: int,
        headers: dict[str, str],
        raw: bytes,
        sent_at: float,
        cost: float,
    ) -> Result:
        latency = time.monotonic() - sent_at
        request_id = headers.get("x-request-id")
        dispatcher = self._dispatcher
        if 200 <= status < 300:
            result = _parse_success(status, raw)
            if result.error is None:
                dispatcher.on_success(lane, sent_at)
                rates = lane.endpoint.rates
                if rates.active or result.body:
                    rates.settle(cost, (result.body or {}).get("usage"))
            result.latency_s = latency
            result.request_id = request_id
            return result
        result = http_error(status, raw)
        result.latency_s = latency
        result.request_id = request_id
        if status in THROTTLE_STATUS:
            wait = parse_retry_after(headers.get("retry-after"), cap_s=self.retry.retry_after_cap_s)
            dispatcher.on_throttle(lane, sent_at, wait)
            raise RetryableFailure(result, wait)
        if status in EJECTING_STATUS:
            dispatcher.on_failure(lane, f"HTTP {status}", connection=False)
            raise RetryableFailure(result, endpoint=lane.endpoint)
        if status in RETRYABLE_STATUS:
            raise RetryableFailure(result)
        return result


def _told_when(failure: RetryableFailure) -> bool:
    """Whether the server itself said when to retry (a throttle with ``Retry-After``)."""
    return failure.retry_after_s is not None and failure.result.status_code in THROTTLE_STATUS


def _parse_success(status: int, raw: bytes) -> Result:
    """A 2xx answer: a ChatCompletion object, or ``bad_upstream_response`` (never an empty
    success: peer lesson 14, case C14)."""
    try:
        body = orjson.loads(raw)
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
    return Result(status_code=status, body=body)


def _bad_upstream(status: int, message: str) -> Result:
    result = failed(ErrorCode.bad_upstream_response, message)
    assert result.error is not None
    result.error.status_code = status
    return result
