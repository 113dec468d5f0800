"""The Gemini Batch API (Developer API) as a :class:`~._backend.RemoteBatchBackend`, on the
``google-genai`` SDK with its own retries off (guide: ``docs/batch-api.md``, "Gemini Batch API").

A part of at most ``inline_bytes`` goes inline in the create (``batchGenerateContent``), a
larger one is uploaded first as a JSONL of ``{"key", "request"}`` lines (:mod:`._gemini_files`);
the batch's ``displayName`` names its job and part, so a create whose answer was lost is found
again in ``GET batches``. Polls and results read the batch operation's JSON, not the SDK's types
(:meth:`GeminiBackend._operation`), each answer translated to a ``chat.completion``
(:mod:`._gemini_translate`): one malformed answer is its own request's
``bad_upstream_response``. Per-request ``google.rpc.Status`` errors ``UNAVAILABLE``,
``INTERNAL``, ``DEADLINE_EXCEEDED`` and ``RESOURCE_EXHAUSTED`` are retryable, the others final.

A prefix shared widely enough is sent once as a cached content (:mod:`._gemini_cache`): made
just before the part goes (its upload, or the inline create), renewed while the batch runs,
deleted once the batch's results are read.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
import warnings
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import orjson
from anyio import to_thread

from .._core.ledger import Billing
from .._core.request import Result, failed
from ..errors import ConfigurationError, ErrorCode
from ..jobs._validate import RequestLine
from ..types import Endpoint
from ._backend import RemoteState, rest_line
from ._gemini_cache import (
    AUTO_MIN_REQUESTS,
    RENEW_AFTER_S,
    TTL_S,
    cache_name_prefix,
    min_tokens,
    reading,
    shared_prefixes,
)
from ._gemini_files import first_model, inline_requests, write_file, write_inline
from ._gemini_translate import Unsupported, embedding_request, to_request
from ._options import GeminiBatchOptions
from ._parts import Limits, private_file
from ._retry import ApiError

if TYPE_CHECKING:
    from google import genai

__all__ = ["GEMINI_URL", "INLINE_BYTES", "INLINE_CAP", "MAX_BYTES", "MAX_LINES", "GeminiBackend"]

T = TypeVar("T")
log = logging.getLogger(__name__)
# the SDK warns on every embeddings batch that the call is experimental: once is in the docs
warnings.filterwarnings("ignore", message=r"batches\.create_embeddings\(\) is experimental")

GEMINI_URL = "https://generativelanguage.googleapis.com"
MAX_BYTES = int(0.95 * 2 * 1024**3)
"""95% of Gemini's 2 GB cap on a batch input file."""
INLINE_CAP = int(0.95 * 20 * 1024**2)
"""95% of Gemini's 20 MB cap on an inline batch request: the most ``inline_bytes`` may be."""
INLINE_BYTES = 1024**2
"""Parts up to this size go inline by default (one call fewer): inline requests pass through the
SDK's pydantic types both ways, far slower than an upload for large parts (``docs/batch-api.md``
has the figures)."""
MAX_LINES = 100_000
"""Requests in one remote batch: Gemini documents no count cap; smaller batches finish (and
are resubmitted) in smaller pieces."""

_CHAT = Endpoint.chat_completions.value
_EMBEDDINGS = Endpoint.embeddings.value
_RUNNING = frozenset(
    {"JOB_STATE_UNSPECIFIED", "JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING"}
    | {"JOB_STATE_PAUSED", "JOB_STATE_UPDATING"}
)


_CACHED = " (cached prefixes)"
"""Ends the display name of a batch whose requests read cached contents."""


def _display_name(marks: dict[str, str]) -> str:
    job = marks.get("batchclient_job", "")
    part = marks.get("batchclient_part", "0")
    return f"batchclient {job} part {part}"


class GeminiBackend:
    """One Gemini API endpoint as a :class:`~._backend.RemoteBatchBackend`. Arguments as
    :class:`~batchclient.GeminiBatchInference`: ``api_key`` None reads ``$GEMINI_API_KEY``,
    else ``$GOOGLE_API_KEY``; ``max_lines`` / ``max_bytes`` None: :data:`MAX_LINES` /
    :data:`MAX_BYTES`; parts up to ``inline_bytes`` go inline.

    Raises:
        ConfigurationError: no key, a bad URL or ``inline_bytes`` over the inline cap.
    """

    name = "gemini-batch"
    endpoints = frozenset({Endpoint.chat_completions, Endpoint.embeddings})

    def __init__(
        self, base_url: str | None, api_key: str | None, options: GeminiBatchOptions
    ) -> None:
        url = (base_url or GEMINI_URL).rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"base_url {base_url!r} is not an http(s) URL")
        if not 0 <= options["inline_bytes"] <= INLINE_CAP:
            raise ConfigurationError(
                f"inline_bytes must be between 0 and {INLINE_CAP} (95% of Gemini's 20 MB cap)"
            )
        key = api_key or os.environ.get("GEMINI_API_KEY") or os.environ.get("GOOGLE_API_KEY")
        if not key:
            raise ConfigurationError(
                "no Gemini API key: pass api_key= or set GEMINI_API_KEY (or GOOGLE_API_KEY)"
            )
        self.api_key = key
        self.base_url = url
        self.limits = Limits(options["max_lines"] or MAX_LINES, options["max_bytes"] or MAX_BYTES)
        self.inline_bytes = options["inline_bytes"]
        self._timeout_s = options["timeout_s"]
        self._headers = dict(options["headers"] or {})
        self._retry_after_cap_s = options["retry"].retry_after_cap_s
        caching = options["prompt_caching"]
        if caching not in (True, False, "auto"):
            raise ConfigurationError(
                f"prompt_caching must be 'auto', True or False, not {caching!r}"
            )
        self.cache_min_requests: int | None = (
            None if caching is False else 2 if caching is True else AUTO_MIN_REQUESTS
        )
        """Requests of a batch that must share a prefix for it to be cached; None: never."""
        self._cached_parts: dict[Path, Path] = {}  # a part file -> its requests reading caches
        self._plain_parts: set[Path] = set()  # part files seen here with nothing to cache
        self._renewed: dict[str, float] = {}  # remote batch -> monotonic time of the last renewal
        self._client: genai.Client | None = None

    def identity(self) -> dict[str, Any]:
        return {"provider": "gemini-batch", "base_url": self.base_url}

    async def start(self) -> None:
        if self._client is not None:
            return
        try:
            from google import genai
            from google.genai import types
        except ImportError:
            raise ConfigurationError(
                "GeminiBatchInference needs the google-genai SDK: pip install 'batchclient[gemini]'"
            ) from None
        options = types.HttpOptions(
            base_url=self.base_url + "/",
            timeout=int(self._timeout_s * 1000),  # milliseconds
            headers=self._headers or None,
        )
        self._client = genai.Client(api_key=self.api_key, http_options=options)

    async def stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aio.aclose()

    async def _call(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """One SDK call; an HTTP answer it failed with, or any other failure (transient), as
        :class:`ApiError`."""
        from google.genai import errors

        try:
            return await fn()
        except Exception as exc:
            if not isinstance(exc, errors.APIError) or not exc.code:
                raise ApiError(f"{what}: {type(exc).__name__}: {exc}", transient=True) from None
            headers = getattr(exc.response, "headers", None)
            retry_after = headers.get("Retry-After") if headers is not None else None
            message = exc.message or exc.status or ""
            cap_s = self._retry_after_cap_s
            raise ApiError.http(what, exc.code, message, retry_after, cap_s) from None

    def _aio(self) -> Any:
        if self._client is None:
            raise ConfigurationError("the Gemini backend is not started")
        return self._client.aio

    # ------------------------------------------------------------------ requests

    async def models(self) -> set[str] | None:
        return None  # not asked: one more call per batch

    async def context_length(self, model: str) -> int | None:
        return None

    def billing(self, model: str) -> Billing:
        """The batch tier; with caching, prefixes from the model's minimum shared by
        :attr:`cache_min_requests` requests are read cached (the one create billed as input)."""
        if self.cache_min_requests is None:
            return Billing("batch")
        return Billing("batch", min_tokens(model), False, self.cache_min_requests)

    def wire_id(self, line: RequestLine) -> str:
        return str(line.seq)  # custom_id may be any string; a key is kept short and plain

    def encode(self, line: RequestLine, endpoint: str) -> bytes | Result:
        if endpoint not in (_CHAT, _EMBEDDINGS):
            return failed(
                ErrorCode.unsupported_parameter,
                f"the Gemini Batch API serves {_CHAT} and {_EMBEDDINGS} only, not {endpoint}",
                param="url",
            )
        model = line.body.get("model")
        if not isinstance(model, str) or not model:
            return failed(ErrorCode.invalid_request, "the request has no model", param="model")
        try:
            request = (
                embedding_request(line.body) if endpoint == _EMBEDDINGS else to_request(line.body)
            )
        except Unsupported as exc:
            return failed(ErrorCode.unsupported_parameter, exc.message, param=exc.param)
        request["model"] = (
            model if model.startswith(("models/", "tunedModels/")) else f"models/{model}"
        )
        return orjson.dumps({"key": self.wire_id(line), "request": request}) + b"\n"

    async def upload(self, path: Path, lines: int, marks: dict[str, str]) -> str | None:
        """Upload a part over ``inline_bytes`` as a file (its name); smaller ones go inline."""
        size = (await anyio.Path(path).stat()).st_size
        # an embeddings batch always goes as a file: only its lines carry a key per request
        embeddings = await to_thread.run_sync(_embeds, path)
        if size <= self.inline_bytes and not embeddings:
            return None
        path = await self._with_caches(path, marks)
        config = {"mime_type": "application/jsonl", "display_name": _display_name(marks)}
        uploaded = await self._call(
            "upload the batch input file",
            lambda: self._aio().files.upload(file=str(path), config=config),
        )
        if not uploaded.name:
            raise ApiError("upload: the answer names no file", status=200, transient=True)
        return str(uploaded.name)

    async def submit(
        self, upload: str | None, path: Path, endpoint: str, window: str, marks: dict[str, str]
    ) -> str:
        from google.genai import types

        src: list[Any] | str
        if endpoint == _EMBEDDINGS:
            return await self._submit_embeddings(upload, path, marks)
        if upload is None:
            source = await self._with_caches(path, marks)
            model, src = await to_thread.run_sync(inline_requests, source)
            what = "create an inline batch"
        else:
            model = await to_thread.run_sync(first_model, path)
            src, what = upload, f"create a batch from {upload}"
        # a batch whose requests read cached contents says so: its end deletes them
        cached = path in self._cached_parts
        if upload is not None and not cached and path not in self._plain_parts:
            # uploaded by an earlier process: the caches it made for the part tell
            cached = self.cache_min_requests is not None and bool(
                await self._caches_of(_display_name(marks))
            )
        label = _display_name(marks) + (_CACHED if cached else "")
        config = types.CreateBatchJobConfig(display_name=label)
        job = await self._call(
            what, lambda: self._aio().batches.create(model=model, src=src, config=config)
        )
        if not job.name:
            raise ApiError(f"{what}: the answer names no batch", status=200, transient=True)
        self._plain_parts.discard(path)
        rewritten = self._cached_parts.pop(path, None)
        if rewritten is not None:
            await anyio.Path(rewritten).unlink(missing_ok=True)
            self._renewed[str(job.name)] = time.monotonic()
        return str(job.name)

    async def _submit_embeddings(
        self, upload: str | None, path: Path, marks: dict[str, str]
    ) -> str:
        """Create an embeddings batch (``asyncBatchEmbedContent``) over the uploaded part."""
        from google.genai import types

        if upload is None:
            raise ApiError("an embeddings part was not uploaded", transient=True)
        model = await to_thread.run_sync(first_model, path)
        config = types.CreateEmbeddingsBatchJobConfig(display_name=_display_name(marks))
        what = f"create an embeddings batch from {upload}"

        job = await self._call(
            what,
            lambda: self._aio().batches.create_embeddings(
                model=model, src={"file_name": upload}, config=config
            ),
        )
        if not job.name:
            raise ApiError(f"{what}: the answer names no batch", status=200, transient=True)
        return str(job.name)

    # ------------------------------------------------------------------ cached contents

    async def _with_caches(self, path: Path, marks: dict[str, str]) -> Path:
        """The part file with each shared prefix worth it (:mod:`._gemini_cache`) made a
        cached content its requests read, beside ``path``; ``path`` itself when none is. Made
        once per part in this process (a retried upload or create reuses them)."""
        least = self.cache_min_requests
        if least is None:
            return path
        known = self._cached_parts.get(path)
        if known is not None and await anyio.Path(known).exists():
            return known
        self._plain_parts.add(path)
        lines = await to_thread.run_sync(_read_lines, path)
        if len(lines) < least:
            return path
        model = str(lines[0]["request"]["model"])
        groups = shared_prefixes([line["request"] for line in lines], model, least)
        if not groups:
            return path
        name_prefix, made = cache_name_prefix(_display_name(marks)), 0
        for n, group in enumerate(groups):
            body = {
                **group.content,
                "model": model,
                "ttl": f"{TTL_S}s",
                "displayName": f"{name_prefix}{n}",
            }
            name = await self._create_cache(body, len(group.requests))
            if name is None:
                continue
            made += 1
            for at in group.requests:
                lines[at]["request"] = reading(lines[at]["request"], name)
        if not made:
            return path
        out = path.with_name(path.name + ".cached")
        await to_thread.run_sync(_write_lines, out, lines)
        self._plain_parts.discard(path)
        self._cached_parts[path] = out
        return out

    async def _create_cache(self, body: dict[str, Any], readers: int) -> str | None:
        """Create one cached content (through the SDK's transport: the prefix goes as the
        JSON it is, not through the SDK's types); its name, or None when Gemini refuses it
        (too short for the model after all, a model without explicit caching: its requests
        go as they are). A transient failure raises (the upload or create is tried again)."""

        async def create() -> Any:
            return await self._aio()._api_client.async_request("post", "cachedContents", body)

        try:
            response = await self._call("create a cached content", create)
        except ApiError as exc:
            if exc.transient:
                raise
            log.info("a shared prefix of %d requests goes uncached: %s", readers, exc)
            return None
        try:
            name = orjson.loads(response.body or b"{}").get("name")
        except (orjson.JSONDecodeError, AttributeError):
            name = None
        if not isinstance(name, str) or not name.startswith("cachedContents/"):
            log.info("a shared prefix goes uncached: the create answered no cachedContents name")
            return None
        return name

    async def _caches_of(self, display_name: str) -> list[str]:
        """The names of the cached contents made for the batch labelled ``display_name``."""
        prefix = cache_name_prefix(display_name)

        async def scan() -> list[str]:
            pager = await self._aio().caches.list(config={"page_size": 1000})
            return [str(c.name) async for c in pager if (c.display_name or "").startswith(prefix)]

        return await self._call("list cached contents", scan)

    async def _renew_caches(self, remote_id: str, display_name: str) -> None:
        """Give a running batch's cached contents another :data:`TTL_S` seconds, at most every
        :data:`RENEW_AFTER_S` seconds (one list and one update per cached content). A failure
        is logged and tried again at the next renewal: the poll goes on."""
        now = time.monotonic()
        if now - self._renewed.get(remote_id, -RENEW_AFTER_S) < RENEW_AFTER_S:
            return
        self._renewed[remote_id] = now
        try:
            for name in await self._caches_of(display_name):
                update = partial(self._aio().caches.update, name=name, config={"ttl": f"{TTL_S}s"})
                await self._call(f"renew {name}", update)
        except ApiError as exc:
            log.warning("the cached contents of %s were not renewed: %s", remote_id, exc)

    async def _drop_caches(self, remote_id: str, display_name: str) -> None:
        """Delete an ended batch's cached contents. A failure is logged, not raised: each
        expires by its TTL anyway, and the batch's results are what matters."""
        self._renewed.pop(remote_id, None)
        try:
            for name in await self._caches_of(display_name):
                delete = partial(self._aio().caches.delete, name=name)
                await self._call(f"delete {name}", delete)
        except ApiError as exc:
            log.warning("a cached content of %s was not deleted (it expires): %s", remote_id, exc)

    async def find(
        self, upload: str | None, marks: dict[str, str], lines: int, since: float
    ) -> str | None:
        names = (_display_name(marks), _display_name(marks) + _CACHED)

        async def scan() -> str | None:
            pager = await self._aio().batches.list(config={"page_size": 100})
            seen = 0
            async for job in pager:
                if job.display_name in names:
                    return str(job.name)
                seen += 1
                if seen >= 2000:  # newest first: an older batch is no lost create of ours
                    return None
            return None

        return await self._call("list batches", scan)

    # ------------------------------------------------------------------ state and results

    async def _operation(self, remote_id: str) -> dict[str, Any]:
        """The batch operation's JSON, through the SDK's own transport (same key, base URL and
        errors): the SDK's ``BatchJob`` drops ``batchStats`` in Developer API mode, and its
        parse would refuse a whole batch for one malformed answer."""
        response = await self._call(
            f"get {remote_id}", lambda: self._aio()._api_client.async_request("get", remote_id, {})
        )
        try:
            data = orjson.loads(response.body or b"{}")
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("metadata", {}), dict):
            raise ApiError(
                f"get {remote_id}: the answer is not a batch operation", status=200, transient=True
            )
        return data

    async def poll(self, remote_id: str) -> RemoteState:
        meta = _object((await self._operation(remote_id)).get("metadata"))
        stats = _object(meta.get("batchStats"))
        counts = (
            _count(stats.get("successfulRequestCount")),
            _count(stats.get("failedRequestCount")),
        )
        state = _state(meta)
        if state in _RUNNING:
            label = str(meta.get("displayName") or "")
            if label.endswith(_CACHED):
                await self._renew_caches(remote_id, label.removesuffix(_CACHED))
            return RemoteState("in_progress", *counts)
        if state == "JOB_STATE_CANCELLING":
            return RemoteState("cancelling", *counts)
        # Only a succeeded batch answered everything; the others return what they answered.
        return RemoteState(
            "ended",
            *counts,
            cancelled=state == "JOB_STATE_CANCELLED",
            partial=state != "JOB_STATE_SUCCEEDED",
        )

    async def results(self, remote_id: str, dest: Path) -> None:
        op = await self._operation(remote_id)
        meta = _object(op.get("metadata"))
        await self._write_results(remote_id, op, dest)
        label = str(meta.get("displayName") or "")
        if label.endswith(_CACHED):
            await self._drop_caches(remote_id, label.removesuffix(_CACHED))

    async def _write_results(self, remote_id: str, op: dict[str, Any], dest: Path) -> None:
        meta = _object(op.get("metadata"))
        output = _object(meta.get("output")) or _object(op.get("response"))
        model = str(meta.get("model") or "")
        inline = _object(output.get("inlinedResponses")).get("inlinedResponses")
        if isinstance(inline, list):
            await to_thread.run_sync(write_inline, inline, model, dest)
            return
        file_name = output.get("responsesFile")
        if isinstance(file_name, str) and file_name:
            raw = dest.with_name(dest.name + ".raw")
            try:
                await self._download(file_name, raw)
                await to_thread.run_sync(write_file, raw, model, dest)
            finally:
                await anyio.Path(raw).unlink(missing_ok=True)
            return
        with private_file(dest) as out:  # no results: nothing ran, or the batch failed
            if _state(meta) == "JOB_STATE_FAILED":
                error = _object(op.get("error")).get("message") or "no results"
                why = f"the remote batch {remote_id} failed: {str(error)[:300]}"
                out.write(rest_line(ErrorCode.batch_failed.value, why, retryable=True))

    async def _download(self, file_name: str, dest: Path) -> None:
        async def save() -> None:
            files = self._aio().files
            with private_file(dest) as f:
                if "destination" in inspect.signature(files.download).parameters:
                    await files.download(file=file_name, destination=f)
                else:  # SDKs before download(destination=) hand the whole file back
                    f.write(await files.download(file=file_name))

        await self._call(f"download {file_name}", save)

    async def cancel(self, remote_id: str) -> None:
        await self._call(f"cancel {remote_id}", lambda: self._aio().batches.cancel(name=remote_id))


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError, OverflowError):
        return 0


def _state(meta: dict[str, Any]) -> str:
    """The batch's ``JOB_STATE_*`` (the REST API says ``BATCH_STATE_*``: one name here)."""
    state = str(meta.get("state") or "").replace("BATCH_STATE_", "JOB_STATE_", 1)
    return state or "JOB_STATE_UNSPECIFIED"


def _embeds(path: Path) -> bool:
    """Whether a part file holds embedding requests (its first line's has ``content``)."""
    with path.open("rb") as f:
        first = f.readline()
    try:
        request = orjson.loads(first).get("request")
    except (orjson.JSONDecodeError, AttributeError):
        return False
    return isinstance(request, dict) and "content" in request


def _read_lines(path: Path) -> list[dict[str, Any]]:
    with path.open("rb") as f:
        return [orjson.loads(raw) for raw in f if raw.strip()]


def _write_lines(path: Path, lines: list[dict[str, Any]]) -> None:
    with private_file(path) as f:
        for line in lines:
            f.write(orjson.dumps(line) + b"\n")
