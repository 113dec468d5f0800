"""A misbehaving Gemini Batch API (Developer API, ``v1`` or ``v1beta``) on loopback.

The wire shapes the ``google-genai`` SDK sends and parses (``client.aio.batches``,
``client.aio.files``), so the SDK pointed here with ``HttpOptions(base_url=stub.url)`` runs
unchanged:

- ``POST /v1beta/models/{model}:asyncBatchEmbedContent``: the same for ``EmbedContentRequest``
  lines of an uploaded file, answered ``{"embedding": {"values": [...]}}`` (8 numbers: the
  text's word count / 1,000, then numbers from its SHA-256).
- ``POST /v1beta/models/{model}:batchGenerateContent`` with ``{"batch": {"displayName",
  "inputConfig": {"requests": {"requests": [{"request", "metadata": {"key"}}]}} or
  {"fileName": "files/..."}}}``: a long-running operation ``{"name": "batches/...",
  "metadata": {"state": "BATCH_STATE_PENDING", "batchStats", ...}}``.
- ``GET /v1beta/batches/{id}`` (``metadata.output`` once done: ``inlinedResponses`` for inline
  input, ``responsesFile`` for file input), ``GET /v1beta/batches`` (``operations``,
  ``nextPageToken``), ``POST /v1beta/batches/{id}:cancel``.
- ``POST /upload/{version}/files`` (resumable: ``start``, then ``upload, finalize`` chunks at
  ``x-goog-upload-url``), ``GET /v1beta/files/{id}:download?alt=media``.
- ``POST /v1beta/cachedContents``, ``GET /v1beta/cachedContents`` (``cachedContents``,
  ``nextPageToken``), ``PATCH`` (a new ``ttl``) and ``DELETE /v1beta/cachedContents/{id}``: a
  request naming a live one (``cachedContent``) is answered as if its contents and system text
  came first, with ``usageMetadata.cachedContentTokenCount``; one naming a deleted or expired
  one fails with ``PERMISSION_DENIED``, and one that also sets ``systemInstruction``,
  ``tools`` or ``toolConfig`` with ``INVALID_ARGUMENT``, as Gemini does.

Requests are answered with an echo of the last user text (``candidates``, ``usageMetadata``);
per-request errors are ``google.rpc.Status`` objects (gRPC ``code``). Faults on demand: results
out of order, refused items, items that fail once with a retryable error, batches that expire
after N items with partial results, batches stuck running, 429 / 5xx on create and polling,
creates whose answer is lost after the batch was made, and malformed answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from ._loopback import LoopbackApp
from ._stub import StubReply

__all__ = ["GeminiBatchStub", "GeminiStubStats"]

_STATE_DONE = ("BATCH_STATE_SUCCEEDED", "BATCH_STATE_FAILED", "BATCH_STATE_CANCELLED")
_NO_CACHE = "CachedContent not found (or permission denied)"
_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatch"


@dataclass
class GeminiStubStats:
    """What the stub saw: ``creates`` (batch creates, answered or not), ``uploads`` (finished
    file uploads) and ``upload_bytes``, ``inline_bytes`` (bodies of creates), ``polls``,
    ``lists``, ``cancels``, ``downloads``, ``requests`` (requests in created batches),
    ``keys`` (every request key submitted, in order), ``cache_creates``, ``cache_renewals``,
    ``cache_deletes`` (cached contents) and ``cache_reads`` (requests answered from one)."""

    creates: int = 0
    uploads: int = 0
    upload_bytes: int = 0
    inline_bytes: int = 0
    polls: int = 0
    lists: int = 0
    cancels: int = 0
    downloads: int = 0
    requests: int = 0
    keys: list[str] = field(default_factory=list)
    cache_creates: int = 0
    cache_renewals: int = 0
    cache_deletes: int = 0
    cache_reads: int = 0


@dataclass
class _Batch:
    op: dict[str, Any]
    items: list[tuple[str, dict[str, Any]]]  # (key, GenerateContentRequest)
    inline: bool
    cancel: bool = False


class GeminiBatchStub(LoopbackApp):
    """The Gemini Batch API stub on ``127.0.0.1`` in a background thread (``with`` or
    ``start()`` / ``stop()``); ``url`` is the SDK's ``base_url`` (no API version).

    Args:
        item_delay_s: seconds to answer each request (requests of one batch one after
            another; batches at once).
        shuffle: results come back in a random order (keys still match).
        refuse_match: requests whose text contains this fail with ``INVALID_ARGUMENT`` (3).
        flaky_match: requests whose text contains this fail with ``UNAVAILABLE`` (14) the
            first time each is run, and succeed after.
        expire_after: a batch expires after answering this many requests; its output holds
            what it answered.
        stuck: batches stay ``BATCH_STATE_RUNNING`` until cancelled.
        create_faults / poll_faults: answers to the first creates / ``GET batches/{id}``, in
            order, instead of the real one (a create fault creates nothing).
        lose_creates: the first N creates make the batch, then answer 502.
        api_key: when set, every call needs ``x-goog-api-key: <api_key>`` (else 401).
        create_delay_s: seconds a create waits, the batch already made, before it answers.
        download_delay_s: seconds a file download waits before it answers.
        malformed: requests whose text contains a key get a malformed answer of that kind:
            ``response`` (not an object), ``candidates`` (an integer) or ``usage`` (a token
            count of 2**70).
        cache_min_words: a cached content of fewer words is refused (400
            ``INVALID_ARGUMENT``, "too small"), as Gemini refuses one under a model's minimum.
        cache_max_ttl_s: cached contents live at most this long (from creation or renewal),
            whatever ``ttl`` they ask.
    """

    _name = "gemini-stub"

    def __init__(
        self,
        *,
        item_delay_s: float = 0.0,
        shuffle: bool = False,
        refuse_match: str | None = None,
        flaky_match: str | None = None,
        expire_after: int | None = None,
        stuck: bool = False,
        create_faults: list[StubReply] | None = None,
        poll_faults: list[StubReply] | None = None,
        lose_creates: int = 0,
        api_key: str | None = None,
        malformed: dict[str, str] | None = None,
        create_delay_s: float = 0.0,
        download_delay_s: float = 0.0,
        cache_min_words: int = 0,
        cache_max_ttl_s: float | None = None,
    ) -> None:
        super().__init__()
        self.cache_min_words = cache_min_words
        self.cache_max_ttl_s = cache_max_ttl_s
        self.caches: dict[str, dict[str, Any]] = {}
        """Live cached contents by name (their JSON as created, ``expireAt`` added: a
        ``time.monotonic()`` instant)."""
        self.malformed = dict(malformed or {})
        self.create_delay_s = create_delay_s
        self.download_delay_s = download_delay_s
        self.item_delay_s = item_delay_s
        self.shuffle = shuffle
        self.refuse_match = refuse_match
        self.flaky_match = flaky_match
        self.expire_after = expire_after
        self.stuck = stuck
        self.create_faults = list(create_faults or [])
        self.poll_faults = list(poll_faults or [])
        self.lose_creates = lose_creates
        self.api_key = api_key
        self.stats = GeminiStubStats()
        self.calls: list[str] = []
        """Every call in arrival order: ``upload``, ``create``, ``poll``, ``list``,
        ``cancel``, ``download``."""
        self.batches: dict[str, _Batch] = {}
        self._flaked: set[str] = set()
        self._uploads: dict[str, dict[str, Any]] = {}
        self._files: dict[str, Path] = {}
        self._dir = Path(tempfile.mkdtemp(prefix="gemini-stub-"))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ routes

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=64 * 1024 * 1024)
        r = app.router
        v = "/{version:v1|v1beta}"  # the SDK's default API version, or the one it was given
        r.add_post(v + "/models/{model:[^/:]+}:batchGenerateContent", self._create)
        r.add_post(v + "/models/{model:[^/:]+}:asyncBatchEmbedContent", self._create)
        r.add_get(v + "/batches", self._list)
        r.add_get(v + "/batches/{id:[^/:]+}", self._get)
        r.add_post(v + "/batches/{id:[^/:]+}:cancel", self._cancel)
        r.add_post("/upload" + v + "/files", self._upload)
        r.add_get(v + "/files/{id:[^/:]+}:download", self._download)
        r.add_post(v + "/cachedContents", self._cache_create)
        r.add_get(v + "/cachedContents", self._cache_list)
        r.add_patch(v + "/cachedContents/{id:[^/:]+}", self._cache_renew)
        r.add_delete(v + "/cachedContents/{id:[^/:]+}", self._cache_delete)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # an upload session URL is its own credential (the SDK sends its chunks without a key)
        session = "upload_id" in request.query
        if self.api_key and not session and request.headers.get("x-goog-api-key") != self.api_key:
            return _error(401, "API key not valid.", "UNAUTHENTICATED")
        response: web.StreamResponse = await handler(request)
        return response

    async def _upload(self, request: web.Request) -> web.Response:
        command = request.headers.get("X-Goog-Upload-Command", "")
        if command == "start":
            meta = await request.json()
            upload_id = secrets.token_hex(8)
            self._uploads[upload_id] = {"meta": meta.get("file") or {}, "data": bytearray()}
            version = request.match_info["version"]
            url = (
                f"{self.url}/upload/{version}/files?upload_id={upload_id}&upload_protocol=resumable"
            )
            return web.json_response({}, headers={"X-Goog-Upload-URL": url})
        upload = self._uploads.get(request.query.get("upload_id", ""))
        if upload is None:
            return _error(404, "no such upload", "NOT_FOUND")
        if int(request.headers.get("X-Goog-Upload-Offset", "-1")) != len(upload["data"]):
            return _error(400, "wrong upload offset", "INVALID_ARGUMENT")
        upload["data"] += await request.read()
        if "finalize" not in command:
            return web.Response(headers={"X-Goog-Upload-Status": "active"})
        file_id = secrets.token_hex(6)
        data = bytes(upload["data"])
        (self._dir / file_id).write_bytes(data)  # small test files: blocking is fine
        self._files[file_id] = self._dir / file_id
        self.stats.uploads += 1
        self.stats.upload_bytes += len(data)
        self.calls.append("upload")
        record = {
            "name": f"files/{file_id}",
            "displayName": upload["meta"].get("displayName", ""),
            "mimeType": upload["meta"].get("mimeType", "application/jsonl"),
            "sizeBytes": str(len(data)),
            "createTime": _now(),
            "uri": f"{self.url}/{request.match_info['version']}/files/{file_id}",
            "state": "ACTIVE",
            "source": "UPLOADED",
        }
        return web.json_response({"file": record}, headers={"X-Goog-Upload-Status": "final"})

    async def _download(self, request: web.Request) -> web.StreamResponse:
        path = self._files.get(request.match_info["id"])
        if path is None:
            return _error(404, "no such file", "NOT_FOUND")
        self.stats.downloads += 1
        self.calls.append("download")
        if self.download_delay_s:
            await self._hold(self.download_delay_s)
        return web.FileResponse(path)

    async def _create(self, request: web.Request) -> web.Response:
        self.stats.creates += 1
        self.calls.append("create")
        raw = await request.read()
        if self.create_faults:
            return _reply(self.create_faults.pop(0))
        self.stats.inline_bytes += len(raw)
        spec = (json.loads(raw).get("batch") or {}) if raw else {}
        source = spec.get("inputConfig") or {}
        inline = "requests" in source
        if inline:
            entries = source["requests"].get("requests") or []
            items = [((e.get("metadata") or {}).get("key", str(i)), e["request"])
                     for i, e in enumerate(entries)]  # fmt: skip
        else:
            name = source.get("fileName") or source.get("file_name") or ""  # the SDK sends either
            path = self._files.get(str(name).removeprefix("files/"))
            if path is None:
                return _error(400, "inputConfig names no uploaded file", "INVALID_ARGUMENT")
            lines = [json.loads(x) for x in path.read_bytes().splitlines() if x.strip()]
            items = [(str(x["key"]), x["request"]) for x in lines]
        self.stats.requests += len(items)
        self.stats.keys.extend(k for k, _ in items)
        name = f"batches/{secrets.token_hex(8)}"
        model = request.match_info["model"]
        metadata = {
            "@type": _TYPE, "name": name, "model": f"models/{model}",
            "displayName": spec.get("displayName", ""), "state": "BATCH_STATE_PENDING",
            "createTime": _now(), "updateTime": _now(),
            "batchStats": {"requestCount": str(len(items)), "pendingRequestCount": str(len(items))},
        }  # fmt: skip
        batch = _Batch({"name": name, "metadata": metadata}, items, inline)
        self.batches[name] = batch
        task = asyncio.get_running_loop().create_task(self._process(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.create_delay_s:
            await self._hold(self.create_delay_s)
        if self.lose_creates > 0:
            self.lose_creates -= 1
            return _error(502, "bad gateway (the batch was created)", "UNAVAILABLE")
        return web.json_response(batch.op)

    async def _list(self, request: web.Request) -> web.Response:
        self.stats.lists += 1
        self.calls.append("list")
        size = int(request.query.get("pageSize", "50"))
        start = int(request.query.get("pageToken") or 0)
        ordered = list(reversed(self.batches.values()))  # newest first
        page = [_listed(b.op) for b in ordered[start : start + size]]
        body: dict[str, Any] = {"operations": page}
        if start + size < len(ordered):
            body["nextPageToken"] = str(start + size)
        return web.json_response(body)

    async def _get(self, request: web.Request) -> web.Response:
        self.stats.polls += 1
        self.calls.append("poll")
        if self.poll_faults:
            return _reply(self.poll_faults.pop(0))
        batch = self.batches.get(f"batches/{request.match_info['id']}")
        if batch is None:
            return _error(404, "batch not found", "NOT_FOUND")
        return web.json_response(batch.op)

    async def _cancel(self, request: web.Request) -> web.Response:
        self.stats.cancels += 1
        self.calls.append("cancel")
        batch = self.batches.get(f"batches/{request.match_info['id']}")
        if batch is None:
            return _error(404, "batch not found", "NOT_FOUND")
        if batch.op["metadata"]["state"] in (*_STATE_DONE, "BATCH_STATE_EXPIRED"):
            return _error(400, "the batch has already ended", "FAILED_PRECONDITION")
        batch.cancel = True
        return web.json_response({})

    # ------------------------------------------------------------------ cached contents

    def _ttl(self, spec: Any) -> float:
        ttl = float(str(spec or "3600s").removesuffix("s"))
        return ttl if self.cache_max_ttl_s is None else min(ttl, self.cache_max_ttl_s)

    def _live(self, name: str) -> dict[str, Any] | None:
        cache = self.caches.get(name)
        if cache is not None and cache["expireAt"] <= time.monotonic():
            del self.caches[name]
            return None
        return cache

    async def _cache_create(self, request: web.Request) -> web.Response:
        body = await request.json()
        words = len(_text(body).split()) + len(_system_text(body).split())
        if words < self.cache_min_words:
            return _error(400, "Cached content is too small.", "INVALID_ARGUMENT")
        self.stats.cache_creates += 1
        self.calls.append("cache_create")
        name = f"cachedContents/{secrets.token_hex(6)}"
        expire_at = time.monotonic() + self._ttl(body.pop("ttl", None))
        cache = {**body, "name": name, "expireAt": expire_at, "words": words}
        self.caches[name] = cache
        return web.json_response(_cache_view(cache))

    async def _cache_list(self, request: web.Request) -> web.Response:
        self.calls.append("cache_list")
        live = [c for c in list(self.caches) if self._live(c) is not None]
        return web.json_response({"cachedContents": [_cache_view(self.caches[c]) for c in live]})

    async def _cache_renew(self, request: web.Request) -> web.Response:
        cache = self._live(f"cachedContents/{request.match_info['id']}")
        if cache is None:
            return _error(403, _NO_CACHE, "PERMISSION_DENIED")
        self.stats.cache_renewals += 1
        self.calls.append("cache_renew")
        cache["expireAt"] = time.monotonic() + self._ttl((await request.json()).get("ttl"))
        return web.json_response(_cache_view(cache))

    async def _cache_delete(self, request: web.Request) -> web.Response:
        name = f"cachedContents/{request.match_info['id']}"
        if self.caches.pop(name, None) is None:
            return _error(403, _NO_CACHE, "PERMISSION_DENIED")
        self.stats.cache_deletes += 1
        self.calls.append("cache_delete")
        return web.json_response({})

    def _with_cache(self, req: dict[str, Any]) -> tuple[dict[str, Any], int] | dict[str, Any]:
        """``req`` with its cached content's turns and system text put back, and the cached
        words; or the ``google.rpc.Status`` it fails with."""
        name = req.get("cachedContent")
        if name is None:
            return req, 0
        if any(key in req for key in ("systemInstruction", "tools", "toolConfig")):
            why = "CachedContent can not be used with GenerateContent request setting "
            why += "system_instruction, tools or tool_config."
            return {"code": 3, "message": why, "status": "INVALID_ARGUMENT"}
        cache = self._live(str(name))
        if cache is None:
            return {"code": 7, "message": _NO_CACHE, "status": "PERMISSION_DENIED"}
        self.stats.cache_reads += 1
        merged = {k: v for k, v in req.items() if k != "cachedContent"}
        merged["contents"] = [*(cache.get("contents") or []), *(req.get("contents") or [])]
        for key in ("systemInstruction", "tools", "toolConfig"):
            if key in cache:
                merged[key] = cache[key]
        return merged, int(cache["words"])

    # ------------------------------------------------------------------ running a batch

    async def _process(self, batch: _Batch) -> None:
        meta = batch.op["metadata"]
        await asyncio.sleep(0.01)
        meta.update(state="BATCH_STATE_RUNNING", updateTime=_now())
        stats = meta["batchStats"]
        ok = bad = 0
        results: list[dict[str, Any]] = []
        final = "BATCH_STATE_SUCCEEDED"
        for n, (key, req) in enumerate(batch.items):
            while self.stuck and not batch.cancel:  # noqa: ASYNC110 (cancel is a plain flag)
                await asyncio.sleep(0.02)
            if batch.cancel:
                final = "BATCH_STATE_CANCELLED"
                break
            if self.expire_after is not None and n >= self.expire_after:
                final = "BATCH_STATE_EXPIRED"
                break
            if self.item_delay_s:
                await asyncio.sleep(self.item_delay_s)
            elif n % 2000 == 1999:
                await asyncio.sleep(0)  # let polls in during a big batch
            read = self._with_cache(req)
            if not isinstance(read, tuple):
                results.append({"key": key, "error": read})
                bad += 1
                continue
            req, cached = read
            text = _text(req) or _text({"contents": [req.get("content") or {}]})
            if self.refuse_match and self.refuse_match in text:
                error = {"code": 3, "message": "refused by the stub", "status": "INVALID_ARGUMENT"}
                results.append({"key": key, "error": error})
                bad += 1
            elif self.flaky_match and self.flaky_match in text and text not in self._flaked:
                self._flaked.add(text)
                error = {"code": 14, "message": "model overloaded", "status": "UNAVAILABLE"}
                results.append({"key": key, "error": error})
                bad += 1
            else:
                answer = self._answer(req, meta["model"])
                if cached and isinstance(answer, dict):
                    answer["usageMetadata"]["cachedContentTokenCount"] = cached
                results.append({"key": key, "response": answer})
                ok += 1
            stats.update(
                successfulRequestCount=str(ok), failedRequestCount=str(bad),
                pendingRequestCount=str(len(batch.items) - ok - bad),
            )  # fmt: skip
        if self.shuffle:
            random.shuffle(results)
        if batch.inline:
            inlined = [
                {("response" if "response" in r else "error"): r.get("response", r.get("error")),
                 "metadata": {"key": r["key"]}}
                for r in results
            ]  # fmt: skip
            output: dict[str, Any] = {"inlinedResponses": {"inlinedResponses": inlined}}
        else:
            file_id = f"batch-{secrets.token_hex(6)}"
            path = self._dir / file_id
            path.write_text("".join(json.dumps(r) + "\n" for r in results))
            self._files[file_id] = path
            output = {"responsesFile": f"files/{file_id}"}
        meta.update(state=final, output=output, updateTime=_now(), endTime=_now())
        batch.op.update(done=True, response={"@type": _TYPE + "Output", **output})

    def _answer(self, request: dict[str, Any], model: str) -> Any:
        if "content" in request:  # an EmbedContentRequest
            return {"embedding": {"values": _vector(_text({"contents": [request["content"]]}))}}
        answer: Any = _answer(request, model)
        kind = next((k for m, k in self.malformed.items() if m in _text(request)), None)
        if kind == "response":
            answer = "not an object"
        elif kind == "candidates":
            answer["candidates"] = 7
        elif kind == "usage":
            answer["usageMetadata"]["candidatesTokenCount"] = 2**70
        return answer

    # ------------------------------------------------------------------ lifecycle

    def _cleanup(self) -> None:
        for path in self._dir.glob("*"):
            path.unlink(missing_ok=True)
        self._dir.rmdir()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())


def _listed(op: dict[str, Any]) -> dict[str, Any]:
    """A batch as listed: without its (possibly large) output."""
    meta = {k: v for k, v in op["metadata"].items() if k != "output"}
    return {"name": op["name"], "metadata": meta, **({"done": True} if op.get("done") else {})}


def _text(request: dict[str, Any]) -> str:
    return "\n".join(
        str(part.get("text", ""))
        for content in request.get("contents") or []
        for part in content.get("parts") or []
    )


def _vector(text: str, size: int = 8) -> list[float]:
    """A deterministic embedding of ``text``: its word count / 1,000 (capped at 1: an answer
    can be told from another's), then numbers from its SHA-256."""
    digest = hashlib.sha256(text.encode()).digest()
    return [min(1.0, len(text.split()) / 1000)] + [round(b / 255, 4) for b in digest[: size - 1]]


def _system_text(request: dict[str, Any]) -> str:
    system = request.get("systemInstruction") or {}
    return "\n".join(str(part.get("text", "")) for part in system.get("parts") or [])


def _cache_view(cache: dict[str, Any]) -> dict[str, Any]:
    """A cached content as Gemini shows it: metadata, not its contents."""
    left = max(0.0, cache["expireAt"] - time.monotonic())
    expire = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + left))
    return {
        "name": cache["name"], "model": cache.get("model", ""),
        "displayName": cache.get("displayName", ""), "expireTime": expire,
        "usageMetadata": {"totalTokenCount": cache["words"]},
    }  # fmt: skip


def _answer(request: dict[str, Any], model: str) -> dict[str, Any]:
    """An echo of the last user text, cut at ``maxOutputTokens`` words."""
    users = [c for c in request.get("contents") or [] if c.get("role") == "user"]
    last: dict[str, Any] = users[-1] if users else {}
    text = " ".join(str(p.get("text", "")) for p in last.get("parts") or [] if "text" in p)
    words = f"echo: {text}".split()
    limit = (request.get("generationConfig") or {}).get("maxOutputTokens")
    finish = "STOP"
    if isinstance(limit, int) and limit < len(words):
        words, finish = words[:limit], "MAX_TOKENS"
    prompt = len(_text(request).split()) + len(_system_text(request).split())
    return {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": " ".join(words)}]},
             "finishReason": finish, "index": 0}
        ],
        "usageMetadata": {
            "promptTokenCount": prompt, "candidatesTokenCount": len(words),
            "totalTokenCount": prompt + len(words),
        },
        "modelVersion": model.removeprefix("models/"),
        "responseId": secrets.token_hex(8),
    }  # fmt: skip


def _reply(fault: StubReply) -> web.Response:
    raw = fault.raw if fault.raw is not None else json.dumps(fault.body or {}).encode()
    return web.Response(status=fault.status, body=raw, headers=fault.headers)


def _error(status: int, message: str, grpc_status: str) -> web.Response:
    body = {"error": {"code": status, "message": message, "status": grpc_status}}
    return web.json_response(body, status=status)
