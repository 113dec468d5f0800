"""A misbehaving Anthropic Message Batches API on loopback (aiohttp.web).

The documented wire (Anthropic API reference, Message Batches): ``POST /v1/messages/batches``
(inline ``requests: [{custom_id, params}]``; a bad ``custom_id``, a duplicate, a request
without ``model`` / ``max_tokens`` / ``messages``, more than 100,000 requests or 256 MB refuse
the whole create with 400 / 413, as do ``temperature`` / ``top_p`` / ``top_k`` under
``anthropic-version: 2026-10-21``), ``GET /v1/messages/batches/{id}`` (a ``MessageBatch``:
``processing_status``, ``request_counts`` that stay zero but ``processing`` until the batch
ends, ``results_url`` once ended), ``GET .../{id}/results`` (JSONL, shuffled),
``POST .../{id}/cancel`` and ``GET /v1/messages/batches`` (newest first; ``before_id`` /
``after_id`` / ``limit``, ``has_more``, ``first_id``, ``last_id``).

Each request is answered with an echo ``Message`` (a ``tool_use`` block when the request has
tools and its text says ``call a tool``). Faults on demand: errored items (``invalid_request``
final, ``overloaded`` for their first N sightings), batches that end with some items expired,
answers to the first creates or polls (429 with ``Retry-After``, 5xx), creates whose answer is
lost after the batch was made, batches stuck in progress until cancelled, and malformed
results.
"""

from __future__ import annotations

import json
import random
import re
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from ._loopback import LoopbackApp
from ._stub import StubReply

__all__ = ["AnthropicBatchStats", "AnthropicBatchStub"]

_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_NO_SAMPLING = "2026-10-21"


@dataclass
class AnthropicBatchStats:
    """What the stub saw: ``creates`` (batches made), ``create_calls`` (``POST`` answered or
    not), ``bytes_in`` (create bodies' bytes), ``requests`` (requests in made batches),
    ``polls``, ``lists``, ``cancels``, ``results`` (results downloads), ``versions``
    (``anthropic-version`` headers seen), ``by_status`` (answers by HTTP status)."""

    creates: int = 0
    create_calls: int = 0
    bytes_in: int = 0
    requests: int = 0
    polls: int = 0
    lists: int = 0
    cancels: int = 0
    results: int = 0
    versions: Counter[str] = field(default_factory=Counter)
    by_status: Counter[int] = field(default_factory=Counter)


@dataclass
class _Batch:
    id: str
    requests: list[dict[str, Any]]
    created: float
    ends: float
    stuck: bool
    expire_from: int | None
    cancel_at: float | None = None
    results: list[bytes] | None = None


class AnthropicBatchStub(LoopbackApp):
    """The Message Batches stub on ``127.0.0.1`` in a background thread (``with`` or
    ``start()`` / ``stop()``); ``url`` is the API root (the SDK's ``base_url``).

    Args:
        process_s: seconds a batch takes to end (simulated processing; no CPU spent).
        error_match: requests whose text contains this end ``errored`` with an
            ``invalid_request_error``.
        overload_match: requests whose text contains this end ``errored`` with an
            ``overloaded_error`` the first ``overload_times`` times they are seen.
        expire_first: the first this-many batches end with all but their first
            ``expire_keep`` requests ``expired`` (a batch that expired with partial results).
        stuck_match: a batch holding a request whose text contains this stays in progress
            until cancelled.
        create_faults / poll_faults: answers to the first creates / polls, in order (nothing
            is made or read): ``StubReply(status=429, headers={"Retry-After": "1"})``.
        lose_creates: the first N creates make the batch, then answer 500.
        api_key: when set, every call needs it (``x-api-key`` or ``Authorization: Bearer``).
        create_delay_s: seconds a create waits, the batch already made, before it answers.
        results_delay_s: seconds a results download waits before it answers.
        malformed: requests whose text contains a key get a malformed result of that kind:
            ``content`` (the message's content an integer), ``usage`` (an output token count
            of 2**70) or ``result`` (a result that is not an object).
    """

    _name = "anthropic-stub"

    def __init__(
        self,
        *,
        process_s: float = 0.05,
        error_match: str | None = None,
        overload_match: str | None = None,
        overload_times: int = 1,
        expire_first: int = 0,
        expire_keep: int = 0,
        stuck_match: str | None = None,
        create_faults: list[StubReply] | None = None,
        poll_faults: list[StubReply] | None = None,
        lose_creates: int = 0,
        api_key: str | None = None,
        seed: int = 0,
        malformed: dict[str, str] | None = None,
        create_delay_s: float = 0.0,
        results_delay_s: float = 0.0,
    ) -> None:
        super().__init__()
        self.malformed = dict(malformed or {})
        self.create_delay_s = create_delay_s
        self.results_delay_s = results_delay_s
        self.process_s = process_s
        self.error_match = error_match
        self.overload_match = overload_match
        self.overload_times = overload_times
        self.expire_first = expire_first
        self.expire_keep = expire_keep
        self.stuck_match = stuck_match
        self.create_faults = list(create_faults or [])
        self.poll_faults = list(poll_faults or [])
        self.lose_creates = lose_creates
        self.api_key = api_key
        self.stats = AnthropicBatchStats()
        self.batches: dict[str, _Batch] = {}
        self.seen: Counter[str] = Counter()
        """How many times each request text was run (to tell what was sent twice)."""
        self.seen_params: list[dict[str, Any]] = []
        """Every request's ``params`` as received."""
        self.cached_prefixes: set[str] = set()
        """The prompt prefixes (text up to a ``cache_control`` mark) written to the cache."""
        self._order: list[str] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ routes

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=300 * 1024 * 1024)
        app.router.add_post("/v1/messages/batches", self._create)
        app.router.add_get("/v1/messages/batches", self._list)
        app.router.add_get("/v1/messages/batches/{id}", self._retrieve)
        app.router.add_get("/v1/messages/batches/{id}/results", self._results)
        app.router.add_post("/v1/messages/batches/{id}/cancel", self._cancel)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.stats.versions[request.headers.get("anthropic-version", "")] += 1
        if self.api_key and self.api_key not in (
            request.headers.get("x-api-key"),
            request.headers.get("Authorization", "").removeprefix("Bearer "),
        ):
            response: web.StreamResponse = _error(401, "authentication_error", "bad x-api-key")
        else:
            response = await handler(request)
        self.stats.by_status[response.status] += 1
        return response

    async def _create(self, request: web.Request) -> web.Response:
        self.stats.create_calls += 1
        if self.create_faults:
            return _reply(self.create_faults.pop(0))
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "invalid_request_error", "the body is not JSON")
        if len(raw) > 256_000_000:
            return _error(413, "request_too_large", "over 256 MB")
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or not 1 <= len(requests) <= 100_000:
            return _error(400, "invalid_request_error", "requests: 1 to 100,000 needed")
        version = request.headers.get("anthropic-version", "")
        ids: set[str] = set()
        for n, item in enumerate(requests):
            refusal = _check(item, version, ids)
            if refusal:
                return _error(400, "invalid_request_error", f"requests.{n}: {refusal}")
        now = time.time()
        stuck = self.stuck_match is not None and any(
            self.stuck_match in _text(r["params"]) for r in requests
        )
        expire = self.expire_keep if self.stats.creates < self.expire_first else None
        batch = _Batch(
            f"msgbatch_{secrets.token_hex(8)}", requests, now, now + self.process_s, stuck, expire
        )
        self.batches[batch.id] = batch
        self._order.append(batch.id)
        self.stats.creates += 1
        self.stats.bytes_in += len(raw)
        self.stats.requests += len(requests)
        self.seen_params.extend(r["params"] for r in requests)
        if self.create_delay_s:
            await self._hold(self.create_delay_s)
        if self.lose_creates > 0:
            self.lose_creates -= 1
            return _error(500, "api_error", "the answer was lost")
        return web.json_response(self._view(batch))

    async def _retrieve(self, request: web.Request) -> web.Response:
        self.stats.polls += 1
        if self.poll_faults:
            return _reply(self.poll_faults.pop(0))
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return _error(404, "not_found_error", "no such batch")
        return web.json_response(self._view(batch))

    async def _list(self, request: web.Request) -> web.Response:
        self.stats.lists += 1
        limit = min(int(request.query.get("limit", "20")), 1000)
        ids = list(reversed(self._order))  # newest first
        if "after_id" in request.query:
            after = request.query["after_id"]
            ids = ids[ids.index(after) + 1 :] if after in ids else []
        page = ids[:limit]
        data = [self._view(self.batches[i]) for i in page]
        return web.json_response(
            {
                "data": data,
                "has_more": len(ids) > limit,
                "first_id": page[0] if page else None,
                "last_id": page[-1] if page else None,
            }
        )

    async def _cancel(self, request: web.Request) -> web.Response:
        self.stats.cancels += 1
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return _error(404, "not_found_error", "no such batch")
        if batch.cancel_at is None and not self._ended(batch):
            batch.cancel_at = time.time()
        return web.json_response(self._view(batch))

    async def _results(self, request: web.Request) -> web.StreamResponse:
        batch = self.batches.get(request.match_info["id"])
        if batch is None or not self._ended(batch):
            return _error(404, "not_found_error", "no results yet")
        self.stats.results += 1
        if self.results_delay_s:
            await self._hold(self.results_delay_s)
        lines = self._finish(batch)
        shuffled = list(lines)
        self._rng.shuffle(shuffled)  # "not guaranteed to be in the same order as requests"
        response = web.StreamResponse(headers={"Content-Type": "application/binary"})
        await response.prepare(request)
        for chunk in range(0, len(shuffled), 512):
            await response.write(b"".join(shuffled[chunk : chunk + 512]))
        await response.write_eof()
        return response

    # ------------------------------------------------------------------ the batch's life

    def _ended(self, batch: _Batch) -> bool:
        if batch.cancel_at is not None:
            return True  # cancels take effect at once here
        return not batch.stuck and time.time() >= batch.ends

    def _finish(self, batch: _Batch) -> list[bytes]:
        """The batch's results, made once (what each request got)."""
        with self._lock:
            if batch.results is None:
                batch.results = [self._result(batch, n, r) for n, r in enumerate(batch.requests)]
            return batch.results

    def _result(self, batch: _Batch, n: int, request: dict[str, Any]) -> bytes:
        params = request["params"]
        text = _text(params)
        result: dict[str, Any]
        if batch.cancel_at is not None and (batch.stuck or n % 2 == 1):
            result = {"type": "canceled"}  # stuck: nothing ran; else half had run
        elif batch.expire_from is not None and n >= batch.expire_from:
            result = {"type": "expired"}
        elif self.error_match and self.error_match in text:
            result = _errored("invalid_request_error", "the stub refuses this request")
        elif self.overload_match and self.overload_match in text:
            self.seen[text] += 1
            if self.seen[text] <= self.overload_times:
                result = _errored("overloaded_error", "Overloaded")
            else:
                result = {"type": "succeeded", "message": _message(params, text)}
        else:
            self.seen[text] += 1
            result = {"type": "succeeded", "message": _message(params, text)}
        if result.get("type") == "succeeded":
            self._cache_usage(params, result["message"]["usage"])
        kind = next((k for m, k in self.malformed.items() if m in text), None)
        if kind == "content" and result.get("type") == "succeeded":
            result["message"]["content"] = 7
        elif kind == "usage" and result.get("type") == "succeeded":
            result["message"]["usage"]["output_tokens"] = 2**70
        elif kind == "result":
            result = 5  # type: ignore[assignment]
        line = {"custom_id": request["custom_id"], "result": result}
        return json.dumps(line).encode() + b"\n"

    def _cache_usage(self, params: dict[str, Any], usage: dict[str, Any]) -> None:
        """Prompt caching as Anthropic reports it: the words up to a request's last
        ``cache_control`` mark are written to the cache the first time that prefix is seen
        (``cache_creation_input_tokens``) and read from it after (``cache_read_input_tokens``);
        ``input_tokens`` keeps the rest. Results are made in request order, so the first
        request of a prefix writes it."""
        prefix = _marked_prefix(params)
        if prefix is None:
            return
        words = max(1, len(prefix.split()))
        usage["input_tokens"] = max(1, usage["input_tokens"] - words)
        if prefix in self.cached_prefixes:
            usage["cache_read_input_tokens"] = words
        else:
            self.cached_prefixes.add(prefix)
            usage["cache_creation_input_tokens"] = words

    def _view(self, batch: _Batch) -> dict[str, Any]:
        ended = self._ended(batch)
        counts = {"processing": len(batch.requests), "succeeded": 0, "errored": 0,
                  "canceled": 0, "expired": 0}  # fmt: skip
        if ended:
            counts["processing"] = 0
            for line in self._finish(batch):
                result = json.loads(line)["result"]
                counts[str(result["type"]) if isinstance(result, dict) else "errored"] += 1
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": "ended" if ended else "in_progress",
            "request_counts": counts,
            "created_at": _iso(batch.created),
            "expires_at": _iso(batch.created + 86400),
            "ended_at": _iso(max(batch.ends, batch.cancel_at or 0)) if ended else None,
            "cancel_initiated_at": _iso(batch.cancel_at) if batch.cancel_at else None,
            "archived_at": None,
            "results_url": f"{self.url}/v1/messages/batches/{batch.id}/results" if ended else None,
        }


def _check(item: Any, version: str, ids: set[str]) -> str | None:
    """Why the create refuses this request, or None."""
    if not isinstance(item, dict) or not isinstance(item.get("params"), dict):
        return "each request needs custom_id and params"
    cid = item.get("custom_id")
    if not isinstance(cid, str) or not _ID.match(cid):
        return f"custom_id {cid!r} does not match ^[a-zA-Z0-9_-]{{1,64}}$"
    if cid in ids:
        return f"custom_id {cid!r} is not unique"
    ids.add(cid)
    params = item["params"]
    for key in ("model", "max_tokens", "messages"):
        if key not in params:
            return f"params.{key}: field required"
    if version == _NO_SAMPLING:
        for key in ("temperature", "top_p", "top_k"):
            if key in params:
                return f"params.{key}: extra inputs are not permitted"
    if _marks(params) > 4:
        return "A maximum of 4 blocks with cache_control may be provided. Found " + str(
            _marks(params)
        )
    return None


def _marks(value: Any) -> int:
    """Every ``cache_control`` in a request, wherever it is (as the API counts them)."""
    if isinstance(value, dict):
        own = value.get("cache_control") is not None
        return own + sum(_marks(v) for k, v in value.items() if k != "cache_control")
    if isinstance(value, list):
        return sum(_marks(v) for v in value)
    return 0


def _marked_prefix(params: dict[str, Any]) -> str | None:
    """The text of the system prompt and messages up to the last block marked
    ``cache_control``, or None without a mark."""
    texts: list[str] = []
    prefix = None
    system = params.get("system")
    blocks: list[Any] = [system] if isinstance(system, str) else list(system or ())
    for message in params.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        blocks += [content] if isinstance(content, str) else list(content or ())
    for block in blocks:
        texts.append(block if isinstance(block, str) else str(block.get("text", "")))
        if isinstance(block, dict) and block.get("cache_control") is not None:
            prefix = "\n".join(texts)
    return prefix


def _text(params: dict[str, Any]) -> str:
    parts: list[str] = []
    for m in params.get("messages") or ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return "\n".join(parts)


def _message(params: dict[str, Any], text: str) -> dict[str, Any]:
    words = f"echo: {text}".split()
    limit = int(params.get("max_tokens") or 16)
    content: list[dict[str, Any]]
    stop = "end_turn"
    tools = params.get("tools") or []
    if tools and "call a tool" in text:
        content = [
            {"type": "tool_use", "id": f"toolu_{secrets.token_hex(6)}",
             "name": tools[0]["name"], "input": {"city": "Paris"}}
        ]  # fmt: skip
        stop = "tool_use"
    else:
        if len(words) > limit:
            words, stop = words[:limit], "max_tokens"
        content = [{"type": "text", "text": " ".join(words)}]
    return {
        "id": f"msg_{secrets.token_hex(8)}",
        "type": "message",
        "role": "assistant",
        "model": params.get("model"),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": max(1, len(text.split())), "output_tokens": len(words)},
    }


def _errored(kind: str, message: str) -> dict[str, Any]:
    error = {"type": "error", "error": {"type": kind, "message": message}}
    return {"type": "errored", "error": error}


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _reply(reply: StubReply) -> web.Response:
    body = reply.raw
    if body is None:
        default = {"type": "error", "error": {"type": "api_error", "message": "stub fault"}}
        body = json.dumps(reply.body if reply.body is not None else default).encode()
    headers = {"Content-Type": "application/json", **reply.headers}
    return web.Response(status=reply.status, body=body, headers=headers)


def _error(status: int, kind: str, message: str) -> web.Response:
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.json_response(body, status=status)
