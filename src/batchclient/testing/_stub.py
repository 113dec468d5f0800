"""A fault-injecting OpenAI-compatible stub server on loopback (re-exported by ``testing``).

A real HTTP server (aiohttp.web) so that clients are exercised over real sockets and real
timing: latency, a capacity above which it answers 429 or 503 (on arrival, like a gateway, or
after working as long as a success takes, like an overloaded backend behind a queue; the capacity
may change mid-run), a per-window quota announced in the ``x-ratelimit-*`` headers of OpenAI,
Azure or a generic gateway (a quota gateway), ``Retry-After`` in seconds or as an HTTP date, 5xx
bursts, connection resets, malformed bodies and slow bodies. Faults are chosen per
request by :class:`Fault` rules (matched on the text of the request's messages and the attempt
number of that exact request) or by a ``handler`` callable for anything else.

Answers are deterministic: the completion echoes the last user message (``"echo: <text>"``),
truncated to ``max_tokens`` words; one word is one token in ``usage``. ``/v1/completions`` and
``/v1/embeddings`` answer likewise (:mod:`._stub_answers`).

Runs in a background thread (``StubServer`` as a context manager, for tests) or as its own
process (``python -m batchclient.testing stub --port P ...``, for benchmarks that need the stub
on another core, or an endpoint to kill).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

from aiohttp import web

from ..types import Endpoint
from ._stub_answers import (
    embedding_body,
    moderation_body,
    responses_body,
    text_completion_body,
)

__all__ = [
    "QUOTA_STYLES",
    "Fault",
    "Quota",
    "StubReply",
    "StubServer",
    "StubStats",
    "openai_duration",
]

# How a quota is announced (``StubServer(quota_style=...)``):
# - ``openai``: ``x-ratelimit-limit/remaining/reset-requests`` (and ``-tokens``), the reset as a
#   Go duration (``230ms``, ``1.5s``, ``6m0s``);
# - ``seconds``: the same, the reset as plain seconds (``0.23``);
# - ``epoch``: the same, the reset as the epoch second when the window ends (``1767225600``),
#   windows on the wall clock;
# - ``azure``: only ``x-ratelimit-remaining-requests`` / ``-tokens``, no limit, no reset; its
#   429s carry ``retry-after-ms`` (and ``Retry-After`` in whole seconds when asked);
# - ``generic``: unsuffixed ``x-ratelimit-limit`` / ``-remaining`` / ``-reset`` (seconds), as
#   API gateways (Kong, Envoy, nginx modules) in front of vLLM send them, for requests only.
QUOTA_STYLES = ("openai", "seconds", "epoch", "azure", "generic")


@dataclass
class StubReply:
    """What the stub does for one request. ``action``: ``"answer"`` (``status`` + ``body``),
    ``"reset"`` (drop the connection without an answer), ``"slow"`` (send headers, then stall
    ``delay_s`` before the body). ``body`` None means the normal ChatCompletion. ``hold``: the
    answer waits until this event is set (requests kept in flight until a test lets them go,
    whatever the machine's speed)."""

    status: int = 200
    body: Any = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    action: str = "answer"
    hold: threading.Event | None = None


@dataclass
class Fault:
    """A rule: requests whose message text contains ``match`` (every request if None) get
    ``reply`` on attempts ``first_attempt``..``last_attempt`` (1-based, per distinct request
    body; None = every attempt). ``retry_after`` adds a ``Retry-After`` header: a number of
    seconds, or ``"date:<seconds>"`` for an HTTP date that many seconds ahead. ``after_s`` /
    ``until_s`` restrict the rule to requests arriving in that window, in seconds since the
    server started (a 5xx burst: ``Fault(StubReply(status=503), after_s=2, until_s=3)``)."""

    reply: StubReply
    match: str | None = None
    first_attempt: int = 1
    last_attempt: int | None = None
    retry_after: str | None = None
    after_s: float | None = None
    until_s: float | None = None

    def applies(self, text: str, attempt: int, elapsed_s: float = 0.0) -> bool:
        if self.after_s is not None and elapsed_s < self.after_s:
            return False
        if self.until_s is not None and elapsed_s >= self.until_s:
            return False
        if self.match is not None and self.match not in text:
            return False
        if attempt < self.first_attempt:
            return False
        return self.last_attempt is None or attempt <= self.last_attempt


@dataclass
class StubStats:
    """What the stub saw. ``max_in_flight`` is the most concurrent requests at once;
    ``by_status`` counts answers by status (``0`` = connection reset), ``by_path`` requests by
    path (``/v1/responses``). With ``record_bodies``,
    ``bodies`` holds every request body in arrival order (refused ones too) and
    ``body_times`` when each arrived (``time.monotonic``)."""

    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    by_path: Counter[str] = field(default_factory=Counter)
    arrivals: list[float] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    body_times: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The counters as JSON-ready data (served at ``GET /stats``)."""
        return {
            "requests": self.requests,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
        }


Handler = Callable[[dict[str, Any], int], StubReply | None]
Answer = Callable[[dict[str, Any]], dict[str, Any]]


def openai_duration(seconds: float) -> str:
    """A duration as OpenAI writes it in ``x-ratelimit-reset-*``: ``230ms``, ``1.5s``,
    ``6m0s``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.3g}s" if minutes else f"{rest:.3g}s"


@dataclass
class Quota:
    """A fixed-window quota, as a gateway keeps it: ``limit`` requests (or tokens) per
    ``period_s``, windows aligned to the server's start. A request that does not fit is
    answered 429 and does not count."""

    limit: int
    period_s: float
    used: int = 0
    window: int = -1

    def fits(self, cost: int, elapsed_s: float) -> bool:
        window = int(elapsed_s // self.period_s)
        if window != self.window:
            self.window, self.used = window, 0
        return self.used + cost <= self.limit

    def reset_in(self, elapsed_s: float) -> float:
        """Seconds until the current window ends."""
        return (int(elapsed_s // self.period_s) + 1) * self.period_s - elapsed_s

    def headers(self, suffix: str, elapsed_s: float, style: str = "openai") -> dict[str, str]:
        remaining = str(max(0, self.limit - self.used))
        reset_in = self.reset_in(elapsed_s)
        if style == "azure":
            return {f"x-ratelimit-remaining-{suffix}": remaining}
        if style == "generic":
            if suffix != "requests":
                return {}
            return {
                "x-ratelimit-limit": str(self.limit),
                "x-ratelimit-remaining": remaining,
                "x-ratelimit-reset": f"{reset_in:.3f}",
            }
        if style == "epoch":  # windows on the wall clock (see _take_quota): whole seconds
            reset = f"{(int(elapsed_s // self.period_s) + 1) * self.period_s:.0f}"
        elif style == "seconds":
            reset = f"{reset_in:.3f}"
        else:
            reset = openai_duration(reset_in)
        return {
            f"x-ratelimit-limit-{suffix}": str(self.limit),
            f"x-ratelimit-remaining-{suffix}": remaining,
            f"x-ratelimit-reset-{suffix}": reset,
        }


def _text_of(body: dict[str, Any]) -> str:
    """The text faults match on: the messages', a completions ``prompt`` or an embeddings
    ``input``."""
    parts: list[str] = [str(body[k]) for k in ("prompt", "input") if k in body]
    for m in body.get("messages") or ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(parts)


def completion_body(body: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """The stub's normal answer to a chat-completions body."""
    messages = body.get("messages") or []
    last_user = next(
        (
            m.get("content")
            for m in reversed(messages)
            if isinstance(m, dict) and m.get("role") == "user"
        ),
        "",
    )
    text = last_user if isinstance(last_user, str) else json.dumps(last_user)
    words = f"echo: {text}".split()
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
    finish = "stop"
    if isinstance(max_tokens, int) and max_tokens < len(words):
        words = words[:max_tokens]
        finish = "length"
    prompt_tokens = len(_text_of(body).split())
    return {
        "id": f"chatcmpl-stub-{random.getrandbits(48):x}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or body.get("model", "stub"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": " ".join(words)},
                "finish_reason": finish,
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(words),
            "total_tokens": prompt_tokens + len(words),
        },
    }


class StubServer:
    """The stub, running on ``127.0.0.1`` in a background thread.

    Args:
        latency_s: time to answer each request, in seconds (plus ``jitter_s`` uniform).
        capacity: answer ``capacity_status`` (429 or 503; with ``capacity_retry_after`` if set:
            seconds, or ``"date:<seconds>"`` for an HTTP date) to requests arriving while this
            many are being served; None = unlimited. Refused requests are not served, so they do
            not count toward it.
        reject_after_work: refuse only after ``latency_s`` (an overloaded backend behind a
            queue, which works on a request, or queues it, before giving up) instead of at once
            (a gateway counting connections).
        capacity_schedule: ``[(after_s, capacity), ...]``: the capacity from ``after_s`` seconds
            after the start on (``capacity`` before the first), e.g. ``[(10, 48), (20, 12)]``.
        faults: :class:`Fault` rules, first match wins.
        handler: ``(body, attempt) -> StubReply | None`` consulted before the rules.
        models: model names served (``GET /v1/models``); other models get 404.
        model_info: extra fields of every ``/v1/models`` entry (e.g. vLLM's ``root``, the
            model path); change the attribute to play a server whose weights were swapped.
        record_bodies: keep every request body in ``stats.bodies``.
        prefix_cache: report ``usage.prompt_tokens_details.cached_tokens`` for chat answers:
            the words of the request's prefix (every message but the last) when that prefix was
            served before, else 0 (a server's prefix cache).
        quota, token_quota: ``(limit, period_s)``: at most ``limit`` requests (tokens: prompt
            words plus ``max_tokens``) per window of ``period_s`` seconds; a request over it
            gets 429. Every answer announces the quota in OpenAI's ``x-ratelimit-*`` headers
            unless ``quota_headers`` is False, in ``quota_style`` (:data:`QUOTA_STYLES`);
            ``quota_retry_after`` adds ``Retry-After`` (the seconds to the window's end, rounded
            up) to those 429s.

    ``url`` is the base URL ending in ``/v1``; ``stats`` what it saw. ``stop()`` (or leaving the
    ``with`` block) closes it; ``kill()`` drops every open connection too, like a dead server.
    """

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        jitter_s: float = 0.0,
        capacity: int | None = None,
        capacity_retry_after: str | None = None,
        capacity_status: int = 429,
        reject_after_work: bool = False,
        capacity_schedule: list[tuple[float, int]] | None = None,
        faults: list[Fault] | None = None,
        handler: Handler | None = None,
        models: tuple[str, ...] = ("smollm2",),
        model_info: dict[str, Any] | None = None,
        record_bodies: bool = False,
        prefix_cache: bool = False,
        quota: tuple[int, float] | None = None,
        token_quota: tuple[int, float] | None = None,
        quota_headers: bool = True,
        quota_retry_after: bool = False,
        quota_style: str = "openai",
        port: int = 0,
    ) -> None:
        if quota_style not in QUOTA_STYLES:
            raise ValueError(f"quota_style must be one of {QUOTA_STYLES}")
        self.latency_s = latency_s
        self.jitter_s = jitter_s
        self.capacity = capacity
        self.capacity_retry_after = capacity_retry_after
        self.capacity_status = capacity_status
        self.reject_after_work = reject_after_work
        self.capacity_schedule = sorted(capacity_schedule or [])
        self.serving = 0  # requests admitted and not answered yet (what the capacity bounds)
        self.faults = list(faults or [])
        self.handler = handler
        self.models = models
        self.model_info = dict(model_info or {})
        self.record_bodies = record_bodies
        self.prefix_cache = prefix_cache
        self._prefixes: set[str] = set()
        self.quotas = {
            name: Quota(*spec)
            for name, spec in (("requests", quota), ("tokens", token_quota))
            if spec is not None
        }
        self.quota_headers = quota_headers
        self.quota_retry_after = quota_retry_after
        self.quota_style = quota_style
        self.stats = StubStats()
        self._attempts: Counter[str] = Counter()
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._killed = False
        self._started = time.monotonic()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # ------------------------------------------------------------------ HTTP handlers

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(Endpoint.chat_completions.value, self._chat)
        app.router.add_post(Endpoint.completions.value, self._completions)
        app.router.add_post(Endpoint.embeddings.value, self._embeddings)
        app.router.add_post(Endpoint.responses.value, self._responses)
        app.router.add_post(Endpoint.moderations.value, self._moderations)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/stats", self._stats)
        return app

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats.summary())

    async def _models(self, request: web.Request) -> web.Response:
        data = [
            {"id": m, "object": "model", "owned_by": "stub", **self.model_info} for m in self.models
        ]
        return web.json_response({"object": "list", "data": data})

    def _reply_for(self, body: dict[str, Any], attempt: int) -> StubReply | None:
        if self.handler is not None:
            reply = self.handler(body, attempt)
            if reply is not None:
                return reply
        text = _text_of(body)
        elapsed = time.monotonic() - self._started
        for fault in self.faults:
            if fault.applies(text, attempt, elapsed):
                reply = dataclasses.replace(fault.reply, headers=dict(fault.reply.headers))
                if fault.retry_after is not None:
                    reply.headers["Retry-After"] = _retry_after_value(fault.retry_after)
                return reply
        return None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._post(request, completion_body)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._post(request, text_completion_body)

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._post(request, embedding_body)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._post(request, responses_body)

    async def _moderations(self, request: web.Request) -> web.StreamResponse:
        return await self._post(request, moderation_body)

    async def _post(self, request: web.Request, answer: Answer) -> web.StreamResponse:
        stats = self.stats
        stats.requests += 1
        stats.by_path[request.path] += 1
        stats.arrivals.append(time.monotonic())
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        try:
            raw = await request.read()
            try:
                body = json.loads(raw)
            except ValueError:
                stats.by_status[400] += 1
                return web.json_response(
                    {"error": {"message": "body is not JSON", "type": "BadRequestError"}},
                    status=400,
                )
            if self.record_bodies:
                stats.bodies.append(body)
                stats.body_times.append(time.monotonic())
            key = raw.decode("utf-8", "replace")
            self._attempts[key] += 1
            attempt = self._attempts[key]
            quota_headers: dict[str, str] = {}
            if self.quotas:
                over = self._take_quota(body, quota_headers)
                if over is not None:
                    return over
            capacity = self._capacity_now()
            if capacity is not None and self.serving >= capacity:
                return await self._refuse_over_capacity()
            self.serving += 1
            try:
                return await self._serve_one(request, body, attempt, answer, quota_headers)
            finally:
                self.serving -= 1
        finally:
            stats.in_flight -= 1

    def _capacity_now(self) -> int | None:
        capacity = self.capacity
        if self.capacity_schedule:
            elapsed = time.monotonic() - self._started
            for after_s, value in self.capacity_schedule:
                if elapsed >= after_s:
                    capacity = value
        return capacity

    async def _refuse_over_capacity(self) -> web.Response:
        if self.reject_after_work and self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        status = self.capacity_status
        self.stats.by_status[status] += 1
        headers = {}
        if self.capacity_retry_after is not None:
            headers["Retry-After"] = _retry_after_value(self.capacity_retry_after)
        kind = "rate_limit_error" if status == 429 else "service_unavailable"
        return web.json_response(
            {"error": {"message": "over capacity", "type": kind, "code": status}},
            status=status,
            headers=headers,
        )

    async def _serve_one(
        self,
        request: web.Request,
        body: dict[str, Any],
        attempt: int,
        answer: Answer,
        quota_headers: dict[str, str],
    ) -> web.StreamResponse:
        stats = self.stats
        reply = self._reply_for(body, attempt)
        delay = self.latency_s + (random.uniform(0, self.jitter_s) if self.jitter_s else 0.0)
        if reply is not None:
            delay += reply.delay_s if reply.action != "slow" else 0.0
        if delay > 0:
            await asyncio.sleep(delay)
        # a threading.Event, set from the test's thread: polled, as no thread may block on it
        while reply is not None and reply.hold is not None and not reply.hold.is_set():  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        if reply is None:
            model = body.get("model")
            if self.models and model not in self.models:
                stats.by_status[404] += 1
                return web.json_response(
                    {
                        "error": {
                            "message": f"The model `{model}` does not exist.",
                            "type": "NotFoundError",
                            "code": 404,
                        }
                    },
                    status=404,
                )
            stats.by_status[200] += 1
            answered = answer(body)
            if self.prefix_cache:
                self._report_cached(body, answered)
            return web.json_response(answered, headers=quota_headers)
        reply.headers = {**quota_headers, **reply.headers}
        return await self._send(request, reply, body, answer)

    def _report_cached(self, body: dict[str, Any], answered: dict[str, Any]) -> None:
        """A prefix cache as vLLM's and OpenAI's servers report it: a chat request's prefix
        (every message but the last) served before counts as ``cached_tokens`` (one token per
        word), one served for the first time as 0."""
        messages = body.get("messages")
        usage = answered.get("usage")
        if not isinstance(messages, list) or not isinstance(usage, dict):
            return
        prefix = json.dumps(messages[:-1], sort_keys=True)
        seen = prefix in self._prefixes
        self._prefixes.add(prefix)
        words = len(_text_of({"messages": messages[:-1]}).split()) if seen else 0
        usage["prompt_tokens_details"] = {"cached_tokens": words}

    def _take_quota(self, body: dict[str, Any], headers: dict[str, str]) -> web.Response | None:
        """Count the request against the quotas (filling ``headers``); the 429 when over.
        Windows start with the server, or on the wall clock's whole periods for the ``epoch``
        style (gateways that announce an epoch reset count ``floor(time / period)``)."""
        elapsed = time.time() if self.quota_style == "epoch" else time.monotonic() - self._started
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 0
        costs = {"requests": 1, "tokens": len(_text_of(body).split()) + int(max_tokens)}
        over = [q for name, q in self.quotas.items() if not q.fits(costs[name], elapsed)]
        if not over:
            for name, quota in self.quotas.items():
                quota.used += costs[name]
        if self.quota_headers:
            for name, quota in self.quotas.items():
                headers.update(quota.headers(name, elapsed, self.quota_style))
        if not over:
            return None
        refused_for = max(q.reset_in(elapsed) for q in over)
        self.stats.by_status[429] += 1
        if self.quota_style == "azure":
            headers["retry-after-ms"] = str(math.ceil(refused_for * 1000))
        if self.quota_retry_after:
            headers["Retry-After"] = str(math.ceil(refused_for))
        return web.json_response(
            {"error": {"message": "quota exceeded", "type": "rate_limit_error", "code": 429}},
            status=429,
            headers=headers,
        )

    async def _send(
        self, request: web.Request, reply: StubReply, body: dict[str, Any], answer: Answer
    ) -> web.StreamResponse:
        if reply.action == "reset":
            self.stats.by_status[0] += 1
            transport = request.transport
            if transport is not None:
                transport.abort()
            raise asyncio.CancelledError  # aiohttp drops the request without an answer
        self.stats.by_status[reply.status] += 1
        if reply.raw is not None:
            payload = reply.raw
        elif reply.body is None:
            payload = json.dumps(answer(body)).encode()
        else:
            payload = json.dumps(reply.body).encode()
        if reply.action == "slow":
            resp = web.StreamResponse(status=reply.status, headers=reply.headers)
            resp.content_type = "application/json"
            await resp.prepare(request)
            await asyncio.sleep(reply.delay_s)
            await resp.write(payload)
            await resp.write_eof()
            return resp
        return web.Response(
            status=reply.status,
            body=payload,
            headers=reply.headers,
            content_type="application/json",
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> StubServer:
        self._thread = threading.Thread(target=self._run, name="stub-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("stub server did not start within 10 s")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self._serve())
        loop.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        # handler_cancellation: a request whose client hung up is cancelled, so ``in_flight``
        # shows whether clients really close their connections.
        self._runner = web.AppRunner(
            self._app(),
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            shutdown_timeout=2.0,  # stop() must not wait a minute for slow in-flight answers
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._port, backlog=4096)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None)
        assert sockets, "the stub's listening socket is missing"
        self.port = int(sockets[0].getsockname()[1])
        self._started = time.monotonic()
        self._ready.set()
        await self._stopped.wait()
        if self._killed:
            # A dead server: stop listening and drop every open connection at once (RST), so
            # clients see connection errors mid-request instead of a graceful close.
            if server is not None:
                server.close()
            for handler in list(self._runner.server.connections if self._runner.server else ()):
                transport = handler.transport
                if transport is not None:
                    _abort(transport)
        await self._runner.cleanup()

    def stop(self) -> None:
        """Stop serving; open connections are closed."""
        if self._loop is not None and self._stopped is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(15)
            self._thread = None

    def kill(self) -> None:
        """Die like a crashed server: the port stops listening and every open connection
        (idle keep-alive ones and those mid-request) is reset without an answer."""
        self._killed = True
        self.stop()

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _abort(transport: asyncio.Transport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:  # SO_LINGER 0: close with RST, as the kernel does for a killed process
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _retry_after_value(spec: str) -> str:
    if spec.startswith("date:"):
        seconds = float(spec[5:])
        return formatdate(time.time() + seconds, usegmt=True)
    return spec
