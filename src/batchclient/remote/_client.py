"""``RemoteProvider``: fan-out to one or more OpenAI-compatible servers (replicas), and
``RemoteBatchInference``, the client over it.

One ``POST {base_url}{path}`` per request, the path from the request's endpoint
(``/chat/completions``, ``/completions``, ``/embeddings``; one-input embedding requests in
flight together go in groups, :mod:`._embed_groups`). Each attempt takes a slot on the
least-loaded usable (replica, model) lane (the router, ``batchclient._routing``: ``dispatch``),
whose limit adapts to throttling (``adaptive``), waits for the replica's rpm/tpm buckets
(``rates``) and its announced quota (``quota``), and is sent over the replica's aiohttp session
(:mod:`._transport`); failures are retried by the policy in ``_routing.retry``. The per-request
timeout starts when the request is sent, after every queue.
``docs/remote.md`` explains every knob and algorithm.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Sequence
from typing import Any, Unpack

import anyio
import orjson
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from .._core.client import BatchClient
from .._core.decode import http_error, load_json
from .._core.ledger import Billing
from .._core.prefix import PROMPT_CACHE_MIN_TOKENS, keys_prompt_caches, prefix_key
from .._core.provider import Provider
from .._core.request import Request, Result, failed
from .._core.responses import Unsupported, from_chat, to_completion
from .._core.scoring import prompt_logprobs_body
from .._core.tokens import Tokenizer
from .._options import document, resolve
from .._routing.dispatch import Dispatcher, Lane, LaneStats, Replica, ReplicasUnavailable
from .._routing.quota import announces_quota
from .._routing.retry import (
    EJECTING_STATUS,
    RETRYABLE_STATUS,
    THROTTLE_STATUS,
    RetryableFailure,
    RetryWait,
    retry_after_of,
)
from .._tools import ToolRefusal, apply_to_body, mentions_tools, plan_tools
from ..errors import ConfigurationError, ErrorCode, ModelNotFoundError
from ..types import Endpoint
from ._embed_groups import EmbeddingGroups
from ._identity import public_url, served_model_facts
from ._options import FLEX_TIMEOUT_S, RemoteOptions
from ._setup import RemoteReplica, build_dispatcher, check_settings, get_models
from ._structured import VllmProbe
from ._tokenize import find_tokenizer
from ._transport import HttpError, HttpResponse, HttpTimeout, ResponseTooLarge
from ._urls import Redactor

__all__ = ["RemoteBatchInference", "RemoteProvider", "RemoteReplica"]

# Answers larger than this are parsed in a worker thread, so the event loop keeps serving the
# other requests meanwhile (orjson reads about 1 GB/s: 4 MiB is a few milliseconds).
_THREAD_PARSE_BYTES = 4 << 20

_PATHS = {endpoint: endpoint.path for endpoint in Endpoint}  # looked up once per request

BaseUrl = str | RemoteReplica | Sequence[str | RemoteReplica]
"""One API root (``.../v1``), or a list of replicas serving the same models."""


@document(RemoteOptions)
class RemoteBatchInference(BatchClient):
    """Batch inference against OpenAI-compatible servers (``/v1/chat/completions``,
    ``/v1/completions``, ``/v1/embeddings``: vLLM servers, OpenAI, llama.cpp servers, ...). Use
    as ``async with``.

    Args (every one after ``base_url`` keyword-only; the options below are
    :class:`RemoteOptions`, the provider's):
        base_url: the API root (e.g. ``http://127.0.0.1:8000/v1``), or a list of replicas
            serving the same models (URLs or :class:`RemoteReplica`); each request goes to the
            least-loaded healthy one. A query string in it (Azure OpenAI's
            ``?api-version=...``) is sent on every path; ``user:password@`` becomes Basic auth
            and is never stored or shown.
        api_key: sent as ``Authorization: Bearer <api_key>`` (surrounding whitespace
            stripped); None sends no header.
        state_dir: where files, batches and results are kept (default
            ``$BATCHCLIENT_STATE_DIR`` or the user data directory; created 0700); batches there
            resume with a client on the same ``base_url``.
        cache: use the result cache in ``state_dir`` for every call and batch (default False;
            see :class:`~batchclient.BatchClient`).
        database: a ``postgresql://`` URL keeping the state there instead of ``state_dir``
            (default ``$BATCHCLIENT_DATABASE_URL``; see :class:`~batchclient.BatchClient`).

    Raises:
        ConfigurationError: a bad argument (e.g. ``AdaptiveConcurrency(minimum=...)`` above
            ``max_concurrency``, a header with a CR/LF, a SOCKS proxy, a missing CA file), or
            an option ``RemoteOptions`` does not declare.
    """

    provider: RemoteProvider

    def __init__(
        self,
        base_url: BaseUrl,
        *,
        api_key: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        cache: bool = False,
        database: str | None = None,
        **options: Unpack[RemoteOptions],
    ) -> None:
        provider = RemoteProvider(base_url, api_key=api_key, **options)
        super().__init__(provider, state_dir=state_dir, cache=cache, database=database)

    @property
    def base_url(self) -> str:
        """The first replica's API root as shown (no trailing slash, userinfo or query)."""
        return self.provider.base_url

    def replica_stats(self) -> list[LaneStats]:
        """Per (replica, model) lane: current concurrency limit, requests sent, successes,
        throttles (429/503/529 answers), failures, limit cuts, ejected/paused state and the
        learned output-token estimate."""
        return self.provider.replica_stats()


class RemoteProvider(Provider):
    """The remote fan-out as a :class:`~batchclient.Provider` (for ``BatchClient``, the server
    and other providers). Arguments as :class:`RemoteBatchInference`, without ``state_dir``
    and ``cache``; the resolved options (every one, defaults filled in) are ``options``."""

    endpoints = frozenset(Endpoint)

    def __init__(
        self, base_url: BaseUrl, *, api_key: str | None = None, **options: Unpack[RemoteOptions]
    ) -> None:
        self.options = o = resolve(RemoteOptions, options, who="the remote provider")
        size = o["embedding_group_size"]
        if type(size) is not int or size < 1:
            raise ConfigurationError(f"embedding_group_size must be an int >= 1, not {size!r}")
        check_settings(o)
        urls = [base_url] if isinstance(base_url, str | RemoteReplica) else list(base_url)
        if not urls:
            raise ConfigurationError("base_url: give at least one replica")
        self.replicas_given = [
            u if isinstance(u, RemoteReplica) else RemoteReplica(u) for u in urls
        ]
        self.max_concurrency = o["max_concurrency"]
        self.max_retries = o["max_retries"]
        self.timeout_s = o["timeout_s"]
        self.adaptive = o["adaptive"] is not False
        self.retry = retry = o["retry"]
        self.timeouts = o["timeouts"]
        self._wait = RetryWait(initial_s=retry.backoff_initial_s, max_s=retry.backoff_max_s)
        self._check_models = o["check_model"]
        self._known_models: dict[str, bool] = {}
        self._vllm_probe = VllmProbe(self.timeouts.list_models_s)
        self._tokenizer_path = o["tokenizer"]
        self._tokenizers: dict[str, Tokenizer] = {}
        self.embedding_group_size = size
        self.prefix_affinity = o["prefix_affinity"]
        self.service_tier = o["service_tier"]
        self.api = o["api"]
        if self.api not in ("chat", "responses"):
            raise ConfigurationError(f"api must be 'chat' or 'responses', not {self.api!r}")
        self.flex = self.service_tier == "flex"
        if self.flex and "timeout_s" not in options:
            self.timeout_s = o["timeout_s"] = FLEX_TIMEOUT_S
        fallback = o["flex_fallback_after_s"]
        if fallback is not None and not fallback > 0:
            raise ConfigurationError(f"flex_fallback_after_s must be > 0 seconds, not {fallback!r}")
        self.flex_fallback_after_s = fallback
        caching = o["prompt_caching"]
        if caching not in (True, False, "auto") or type(caching) not in (bool, str):
            raise ConfigurationError(
                f"prompt_caching must be 'auto', True or False, not {caching!r}"
            )
        self._cache_retention = o["prompt_cache_retention"]
        self._embedding_groups = EmbeddingGroups(size, self._send_embeddings)

        def build() -> Dispatcher:
            return build_dispatcher(self.replicas_given, api_key=api_key, options=o)

        self._build = build
        self._dispatcher = build()  # checks every setting now, before any connection
        self.base_url = self._dispatcher.replicas[0].base_url
        self.sends_cache_key = caching is True or (
            caching == "auto"
            and all(keys_prompt_caches(r.pool.address.origin) for r in self._dispatcher.replicas)
        )
        self._adds_fields = self.sends_cache_key or self.service_tier is not None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self._dispatcher.close()
        self._dispatcher = self._build()

    async def stop(self) -> None:
        await self._dispatcher.close()

    def max_in_flight(self) -> int:
        return sum(replica.settings.maximum for replica in self._dispatcher.replicas)

    def identity(self) -> dict[str, Any]:
        # api="responses" changes where chat requests go (said only then: older jobs resume)
        extra = {"api": self.api} if self.api != "chat" else {}
        return {"provider": "remote", "base_url": self.base_url, **extra}

    async def cache_identity(self, model: str) -> dict[str, Any]:
        """Every replica's URL (without credentials) and what ``GET /models`` reports about
        ``model`` (:func:`served_model_facts`: ``root``, ``parent``, ``owned_by``,
        ``max_model_len``, a stable ``created``), so other weights served under the same name
        miss the cache. A server that cannot list models gives ``"served": None``."""
        cards = await self._model_cards()
        card = (cards or {}).get(model)
        return {
            "provider": "remote",
            "base_urls": sorted({public_url(e.url) for e in self.replicas_given}),
            "model": model,
            "served": None if card is None else served_model_facts(card),
            **({"api": self.api} if self.api != "chat" else {}),
        }

    async def tokenizer_path(self, model: str) -> str | None:
        """The served model's ``root`` when it is a directory on this machine (a vLLM server
        started here with ``--model DIR``), else None."""
        card = ((await self._model_cards()) or {}).get(model)
        root = card.get("root") if card else None
        if isinstance(root, str) and root and await anyio.Path(root).is_dir():
            return root
        return None

    def concurrency_limit(self) -> int | None:
        return self._dispatcher.concurrency_limit()

    def billing(self, model: str) -> Billing:
        """``flex`` with ``service_tier="flex"``, else ``standard``; prefixes of 1,024 tokens
        or more are cached (OpenAI's automatic caching; vLLM's prefix cache takes shorter ones,
        at no price), writes not billed apart."""
        return Billing("flex" if self.flex else "standard", PROMPT_CACHE_MIN_TOKENS)

    def replica_stats(self) -> list[LaneStats]:
        """Per (replica, model) lane: current concurrency limit, requests sent, successes,
        throttles (429/503/529 answers), failures, limit cuts, ejected/paused state and the
        learned output-token estimate."""
        return self._dispatcher.stats()

    # ------------------------------------------------------------------ model check

    async def check_model(self, model: str) -> None:
        if not self._check_models or model in self._known_models:
            return
        listed = await self._list_models()
        if listed is None:  # no replica can list models: let each request find out
            self._known_models[model] = True
            return
        if model not in listed:
            raise ModelNotFoundError(model, sorted(listed))
        self._known_models[model] = True

    async def models(self) -> list[str]:
        """The models the first replica that can list them lists (``GET /models``), sorted;
        empty when none can."""
        return sorted(await self._list_models() or ())

    async def _list_models(self) -> set[str] | None:
        """The models of the first replica that answers ``GET /models``, else None."""
        cards = await self._model_cards()
        return None if cards is None else set(cards)

    async def _model_cards(self) -> dict[str, dict[str, Any]] | None:
        """``{id: model object}`` from the first replica that answers ``GET /models``."""
        for replica in self._dispatcher.replicas:
            resp = await get_models(replica, self.timeouts.list_models_s)
            try:
                data = load_json(resp.body) if resp is not None and resp.status == 200 else None
            except ValueError:
                continue
            entries = data.get("data") if isinstance(data, dict) else None
            if isinstance(entries, list):
                return {str(e.get("id")): e for e in entries if isinstance(e, dict)}
        return None

    # ------------------------------------------------------------------ tokenizer

    async def tokenizer(self, model: str) -> Tokenizer:
        """``tokenizer=`` (a local folder), else the server's ``/tokenize`` route; raises
        ``ConfigurationError`` when neither is there (``remote/_tokenize.py``)."""
        known = self._tokenizers.get(model)
        if known is not None:
            return known
        cards = await self._model_cards() if self._tokenizer_path is not None else None
        entries = None if cards is None else list(cards.values())
        made = await find_tokenizer(
            self._tokenizer_path,
            model,
            self._dispatcher.replicas[0],
            entries,
            self.timeouts.list_models_s,
        )
        self._tokenizers[model] = made
        return made

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
            refused = await self._vllm_probe.grammar_refusal(self._dispatcher.replicas)
            if refused is not None:
                return refused
        if request.score_span is not None and await self._all_vllm():
            body = prompt_logprobs_body(body)
        endpoint = request.endpoint
        if endpoint is Endpoint.embeddings:
            return await self._embedding_groups.execute(body)
        if self._adds_fields and endpoint is Endpoint.chat_completions:
            body = self._with_tier_and_key(request, body)
        as_responses = self.api == "responses" and endpoint is Endpoint.chat_completions
        if as_responses:
            try:
                body = from_chat(body)
            except Unsupported as exc:
                return failed(
                    ErrorCode.unsupported_parameter, exc.message, status_code=400, param=exc.param
                )
            endpoint = Endpoint.responses
        # what ``_send_embeddings`` does, inlined: one coroutine less per request on the hot path
        model = str(body.get("model"))
        data = _encoded(body)
        if isinstance(data, Result):
            return data
        path = _PATHS[endpoint]  # below the API root: "/v1/chat/completions" -> "/chat/..."
        # the shared prefix's key, for replica affinity (one replica: nothing to choose)
        key = (
            prefix_key(request)
            if self.prefix_affinity and len(self._dispatcher.replicas) > 1
            else None
        )
        if self.flex and body.get("service_tier") == "flex":
            result = await self._send_flex(model, path, body, data, endpoint, key)
        else:
            result = await self._send(model, path, body, data, endpoint, key)
        if as_responses:
            result = _as_completion(result)
        if tools is not None and result.error is None and result.body is not None:
            apply_to_body(tools, result.body)
        return result

    async def _send(
        self,
        model: str,
        path: str,
        body: dict[str, Any],
        data: bytes,
        endpoint: Endpoint,
        key: int | None,
    ) -> Result:
        """One request with its retries: the first attempt outside tenacity (the fast path)."""
        try:
            return await self._attempt(model, path, body, data, endpoint, None, key=key)
        except RetryableFailure as first:
            return await self._retry(model, path, body, data, endpoint, first, key)

    def _with_tier_and_key(self, request: Request, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with ``service_tier`` and, for a request with a shared prefix,
        ``prompt_cache_key`` (and ``prompt_cache_retention``) added where the body has none: a
        new dict, so the request's own body (the result cache's key) stays as given."""
        extra: dict[str, Any] = {}
        if self.service_tier is not None and "service_tier" not in body:
            extra["service_tier"] = self.service_tier
        cache_key = request.prompt_cache_key
        if cache_key is not None and self.sends_cache_key and "prompt_cache_key" not in body:
            extra["prompt_cache_key"] = cache_key
            if self._cache_retention is not None and "prompt_cache_retention" not in body:
                extra["prompt_cache_retention"] = self._cache_retention
        return {**body, **extra} if extra else body

    async def _send_flex(
        self,
        model: str,
        path: str,
        body: dict[str, Any],
        data: bytes,
        endpoint: Endpoint,
        key: int | None,
    ) -> Result:
        """A flex request: capacity refusals (:func:`capacity_refusal`) are waited out and sent
        again until ``timeout_s`` after the first send; with ``flex_fallback_after_s``, a
        request still unanswered that long after its first send is sent again on the
        standard tier (``service_tier`` removed), an attempt then in flight abandoned."""
        started = time.monotonic()
        fallback = self.flex_fallback_after_s
        answer: Result | None = None  # set once flex has answered (or given up)
        with anyio.move_on_after(math.inf if fallback is None else fallback):
            waits = 0
            while True:
                result = await self._send(model, path, body, data, endpoint, key)
                left = started + self.timeout_s - time.monotonic()
                if not capacity_refusal(result) or left <= 0:
                    answer = result
                    break
                backoff = self.retry.backoff_initial_s * 2.0**waits
                pause = min(backoff, self.retry.backoff_max_s) * (1.0 + 0.1 * random.random())
                await anyio.sleep(min(pause, left))
                waits += 1
        if answer is not None:
            return answer
        standard = {k: v for k, v in body.items() if k != "service_tier"}
        encoded = _encoded(standard)  # the same body but one field: it encodes as it did
        if isinstance(encoded, Result):
            return encoded
        result = await self._send(model, path, standard, encoded, endpoint, key)
        result.extra["service_tier_fallback"] = True
        return result

    async def _send_embeddings(self, body: dict[str, Any]) -> Result:
        """Send one ``/v1/embeddings`` body (a group's, or one input's), with the routing and
        retries of every request."""
        endpoint = Endpoint.embeddings
        model = str(body.get("model"))
        data = _encoded(body)
        if isinstance(data, Result):
            return data
        return await self._send(model, _PATHS[endpoint], body, data, endpoint, None)

    async def _all_vllm(self) -> bool:
        for replica in self._dispatcher.replicas:
            if not await self._vllm_probe.is_vllm(replica):
                return False
        return True

    async def _retry(
        self,
        model: str,
        path: str,
        body: dict[str, Any],
        data: bytes,
        endpoint: Endpoint,
        first: RetryableFailure,
        key: int | None = None,
    ) -> Result:
        replay = [first]  # tenacity's first attempt re-raises the failure we already had
        avoid = first.replica
        # a server that was full (the limit now within what it served) takes the request again
        # as soon as a slot frees under the limit: once per request, not after its Retry-After
        # (which held the request back a whole second while the server had room, and made the
        # end of a call wait for it); a second refusal waits as the server says
        full_once = _when_full(first, used=False)
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
                        result = await self._attempt(
                            model, path, body, data, endpoint, avoid, told_when, key=key
                        )
                    except RetryableFailure as again:
                        avoid = again.replica or avoid
                        full_once = _when_full(again, used=full_once)
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
        path: str,
        body: dict[str, Any],
        data: bytes,
        endpoint: Endpoint,
        avoid: Replica | None,
        past_pause: bool = False,
        *,
        key: int | None = None,
    ) -> Result:
        """Send once (``key``: the request's prefix key, for replica affinity). Returns the
        final result, or raises ``RetryableFailure``."""
        dispatcher = self._dispatcher
        lane = dispatcher.try_acquire(model, avoid, past_pause, key)
        if lane is None:
            try:
                lane = await dispatcher.acquire(model, avoid, past_pause, key)
            except ReplicasUnavailable as exc:
                result = failed(ErrorCode.endpoint_unavailable, str(exc))
                if exc.final:  # nothing listens anywhere: retrying only delays the error
                    return result
                raise RetryableFailure(
                    result, min(exc.wait_s, self.retry.retry_after_cap_s)
                ) from None
        replica = lane.replica
        # a request that already failed on a replica: its failures say little about this one
        counts = avoid is None
        marks = None
        try:
            rates = replica.rates
            # always estimated: a token quota may be announced by any answer, and the requests
            # already on their way must count against it then
            cost = rates.estimate(body)
            if rates.active:
                await rates.acquire(cost)  # before the clock starts: queueing is not sending
            marks = replica.quota.on_send(cost)
            sent_at = time.monotonic()
            token = lane.sending(sent_at)
            try:
                resp = await replica.pool.request("POST", path, data, timeout=self.timeout_s)
            except HttpTimeout:
                dispatcher.on_failure(lane, "timeout", connection=False, counts=counts)
                msg = f"no answer within {self.timeout_s:g} s of sending"
                raise RetryableFailure(failed(ErrorCode.timeout, msg), replica=replica) from None
            except HttpError as exc:
                dispatcher.on_failure(
                    lane, str(exc), connection=True, refused=exc.refused, counts=counts
                )
                problem = dispatcher.unavailable() if exc.refused else None
                if problem is not None and problem.final:  # nothing listens anywhere
                    return failed(ErrorCode.endpoint_unavailable, str(problem))
                result = failed(ErrorCode.connection_error, f"{replica.base_url}: {exc}")
                raise RetryableFailure(result, replica=replica) from None
            except ResponseTooLarge as exc:  # the same answer again on a retry: not retried
                replica.answered = True
                return failed(ErrorCode.response_too_large, f"{replica.base_url}: {exc}")
            replica.answered = True
            parsed: Any = None
            if 200 <= resp.status < 300 and len(resp.body) > _THREAD_PARSE_BYTES:
                parsed = await anyio.to_thread.run_sync(_parse_json, resp.body)
            return self._outcome(lane, resp, sent_at, cost, marks, parsed, endpoint, counts)
        finally:
            if marks is not None:
                lane.landed(token)
            if marks is None:  # given back unsent (cancelled while waiting for the buckets)
                replica.quota.unreserve()
            dispatcher.release(lane)

    def _outcome(
        self,
        lane: Lane,
        resp: HttpResponse,
        sent_at: float,
        cost: float,
        marks: tuple[float, float],
        parsed: Any,
        endpoint: Endpoint,
        counts: bool = True,
    ) -> Result:
        now = time.monotonic()
        status, headers, raw = resp.status, resp.headers, resp.body
        replica = lane.replica
        quota_zero = (
            replica.quota.observe(headers, marks, now) if announces_quota(headers) else False
        )
        request_id = headers.get("x-request-id")
        dispatcher = self._dispatcher
        if 200 <= status < 300:
            result = _parse_success(status, raw, parsed, replica.pool.redactor, endpoint)
            if result.error is None:
                dispatcher.on_success(lane, sent_at)
                rates = replica.rates
                if rates.active or result.body:
                    rates.settle(cost, (result.body or {}).get("usage"))
            result.latency_s = now - sent_at
            result.request_id = request_id
            return result
        result = http_error(status, replica.pool.redactor.raw(raw))
        result.latency_s = now - sent_at
        result.request_id = request_id
        if status in THROTTLE_STATUS:
            cap = self.retry.retry_after_cap_s
            wait = retry_after_of(headers, cap_s=cap)
            if wait is None and quota_zero and replica.quota.reset_in(now) is not None:
                wait = min(cap, replica.quota.reset_in(now) or 0.0)
            full = dispatcher.on_throttle(lane, sent_at, wait, quota_zero=quota_zero)
            raise RetryableFailure(result, wait, full=full)
        if status in EJECTING_STATUS:
            dispatcher.on_failure(lane, f"HTTP {status}", connection=False, counts=counts)
            raise RetryableFailure(result, replica=replica)
        if status in RETRYABLE_STATUS:
            raise RetryableFailure(result)
        return result


_CAPACITY_WORDS = ("resource_unavailable", "resource unavailable", "capacity")


def capacity_refusal(result: Result) -> bool:
    """Whether ``result`` says the flex tier is out of capacity, not that the request is
    wrong: HTTP 498 (Groq's ``capacity_exceeded``), 503 or 529, or a 429 whose error names
    resource unavailability or capacity (OpenAI's flex "429 Resource Unavailable"); a plain
    rate-limit 429 is not one."""
    status = result.status_code
    if status in (498, 503, 529):
        return True
    if status != 429:
        return False
    error = (result.body or {}).get("error")
    if not isinstance(error, dict):
        return False
    words = " ".join(str(error.get(k) or "") for k in ("code", "type", "message")).lower()
    return any(word in words for word in _CAPACITY_WORDS)


def _encoded(body: dict[str, Any]) -> bytes | Result:
    """``body`` as JSON bytes, or the item's ``invalid_request`` when it cannot be JSON: text
    that is not valid Unicode (a lone surrogate such as ``"\\ud800"``, which Python strings
    may hold), an integer past 64 bits, an object JSON has no form for."""
    try:
        return orjson.dumps(body)
    except TypeError as exc:  # orjson.JSONEncodeError is one
        return failed(
            ErrorCode.invalid_request,
            f"the request cannot be sent as JSON: {exc} (text must be valid Unicode, without "
            "lone surrogates; integers within 64 bits)",
            status_code=400,
        )


def _when_full(failure: RetryableFailure, *, used: bool) -> bool:
    """Let a request refused by a full server go again as soon as a slot frees (its wait 0),
    unless an earlier refusal of it already did; whether one did now."""
    if failure.full and not used:
        failure.retry_after_s = 0.0
        return True
    return used


def _told_when(failure: RetryableFailure) -> bool:
    """Whether the server itself said when to retry (a throttle with ``Retry-After``)."""
    return failure.retry_after_s is not None and failure.result.status_code in THROTTLE_STATUS


class _NotJson(Exception):
    pass


def _parse_json(raw: bytes | bytearray) -> Any:
    try:
        return load_json(raw)
    except ValueError:
        return _NotJson()


def _parse_success(
    status: int, raw: bytes | bytearray, parsed: Any, redactor: Redactor, endpoint: Endpoint
) -> Result:
    """A 2xx answer: the endpoint's object (``choices`` for completions, ``data`` for
    embeddings, ``output`` for responses), or ``bad_upstream_response`` with an excerpt (never
    an empty success: vllm PR #44255; a 200 without ``choices`` raised KeyError in litellm
    #13139)."""
    if parsed is not None:
        body = parsed
    else:
        try:  # load_json's first step inline: this runs once per answer
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = _parse_json(raw)
    if isinstance(body, _NotJson):
        return _bad_upstream(status, f"answer is not JSON: {redactor.excerpt(raw)}")
    if not isinstance(body, dict):
        return _bad_upstream(status, f"answer is not a JSON object: {redactor.excerpt(raw)}")
    if endpoint is Endpoint.embeddings:
        data = body.get("data")
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            return _bad_upstream(status, f"answer without data: {redactor.excerpt(raw)}")
        return Result(status_code=status, body=body)
    if endpoint is Endpoint.moderations:
        if not isinstance(body.get("results"), list):
            return _bad_upstream(status, f"answer without results: {redactor.excerpt(raw)}")
        return Result(status_code=status, body=body)
    if endpoint is Endpoint.responses:
        if not isinstance(body.get("output"), list):
            return _bad_upstream(status, f"answer without output: {redactor.excerpt(raw)}")
        if body.get("status") == "failed":
            error = body.get("error")
            detail = error.get("message") if isinstance(error, dict) else None
            message = redactor.text(str(detail)) if detail else redactor.excerpt(raw)
            return _bad_upstream(status, f"the response failed: {message}")
        return Result(status_code=status, body=body)
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        upstream = body.get("error")
        detail = upstream.get("message") if isinstance(upstream, dict) else upstream
        if not isinstance(detail, str) or not detail:
            detail = redactor.excerpt(raw)
        return _bad_upstream(status, f"answer without choices: {redactor.text(detail)}")
    return Result(status_code=status, body=body)


def _as_completion(result: Result) -> Result:
    """A ``Response`` answer (``api="responses"``) as the chat completion it stands for."""
    if result.error is not None or not isinstance(result.body, dict):
        return result
    completion = to_completion(result.body)
    if completion is None:
        status = result.status_code or 200
        return _bad_upstream(status, "the answer is not a usable Response")
    result.body = completion
    return result


def _bad_upstream(status: int, message: str) -> Result:
    result = failed(ErrorCode.bad_upstream_response, message)
    assert result.error is not None
    result.error.status_code = status
    return result
