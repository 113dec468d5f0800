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
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import orjson
from anyio import to_thread

from .._core.request import Result, failed
from ..errors import ConfigurationError, ErrorCode
from ..jobs._validate import RequestLine
from ..types import Endpoint
from ._backend import RemoteState, rest_line
from ._gemini_files import first_model, inline_requests, write_file, write_inline
from ._gemini_translate import Unsupported, to_request
from ._options import GeminiBatchOptions
from ._parts import Limits, private_file
from ._retry import ApiError

if TYPE_CHECKING:
    from google import genai

__all__ = ["GEMINI_URL", "INLINE_BYTES", "INLINE_CAP", "MAX_BYTES", "MAX_LINES", "GeminiBackend"]

T = TypeVar("T")

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

_CHAT = "/v1/chat/completions"
_RUNNING = frozenset(
    {"JOB_STATE_UNSPECIFIED", "JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING"}
    | {"JOB_STATE_PAUSED", "JOB_STATE_UPDATING"}
)


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
    endpoints = frozenset({Endpoint.chat_completions})

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

    def wire_id(self, line: RequestLine) -> str:
        return str(line.seq)  # custom_id may be any string; a key is kept short and plain

    def encode(self, line: RequestLine, endpoint: str) -> bytes | Result:
        if endpoint != _CHAT:
            return failed(
                ErrorCode.unsupported_parameter,
                f"the Gemini Batch API serves {_CHAT} only, not {endpoint}",
                param="url",
            )
        model = line.body.get("model")
        if not isinstance(model, str) or not model:
            return failed(ErrorCode.invalid_request, "the request has no model", param="model")
        try:
            request = to_request(line.body)
        except Unsupported as exc:
            return failed(ErrorCode.unsupported_parameter, exc.message, param=exc.param)
        request["model"] = (
            model if model.startswith(("models/", "tunedModels/")) else f"models/{model}"
        )
        return orjson.dumps({"key": self.wire_id(line), "request": request}) + b"\n"

    async def upload(self, path: Path, lines: int, marks: dict[str, str]) -> str | None:
        """Upload a part over ``inline_bytes`` as a file (its name); smaller ones go inline."""
        size = (await anyio.Path(path).stat()).st_size
        if size <= self.inline_bytes:
            return None
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

        config = types.CreateBatchJobConfig(display_name=_display_name(marks))
        src: list[Any] | str
        if upload is None:
            model, src = await to_thread.run_sync(inline_requests, path)
            what = "create an inline batch"
        else:
            model = await to_thread.run_sync(first_model, path)
            src, what = upload, f"create a batch from {upload}"
        job = await self._call(
            what, lambda: self._aio().batches.create(model=model, src=src, config=config)
        )
        if not job.name:
            raise ApiError(f"{what}: the answer names no batch", status=200, transient=True)
        return str(job.name)

    async def find(
        self, upload: str | None, marks: dict[str, str], lines: int, since: float
    ) -> str | None:
        name = _display_name(marks)

        async def scan() -> str | None:
            pager = await self._aio().batches.list(config={"page_size": 100})
            seen = 0
            async for job in pager:
                if job.display_name == name:
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
        meta = (await self._operation(remote_id)).get("metadata") or {}
        stats = _object(meta.get("batchStats"))
        counts = (
            _count(stats.get("successfulRequestCount")),
            _count(stats.get("failedRequestCount")),
        )
        state = _state(meta)
        if state in _RUNNING:
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
