"""The Files and Batches calls of a remote OpenAI Batch API, over aiohttp.

``POST /files`` (multipart, streamed from disk), ``POST /batches``, ``GET /batches/{id}``,
``GET /batches`` (paged), ``POST /batches/{id}/cancel``, ``GET /files/{id}/content`` (streamed to
disk) and ``GET /models`` (OpenAI API reference: Files, Batch). Providers that copy that shape
with small differences (Together, Groq, Mistral) are *flavours*: their paths, file purpose,
create body, paging and batch objects are translated in :mod:`._flavors`, so what this module
hands back is always OpenAI's ``Batch``. aiohttp rather than the openai SDK:
every retry is ours, so a 429's ``Retry-After`` reaches the polling backoff instead of being
absorbed by the SDK's own retries, and uploads and downloads stream through a fixed buffer
(``docs/design.md``).

Each call is one attempt: a failure raises :class:`ApiError`, ``transient`` for connection
errors, timeouts, 408/409/429/5xx and a malformed 2xx answer (with the server's
``Retry-After``), which the runner retries (:mod:`._retry`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import anyio
from pydantic import BaseModel, ConfigDict, ValidationError

from .._redact import redact_url
from .._routing.retry import parse_retry_after
from ..errors import ConfigurationError
from ..types import BatchStatus
from ._flavors import FlavorSpec, create_body, flavor_of, list_params, normalize, read_page
from ._retry import ApiError, Retrier

T = TypeVar("T")

_TRANSIENT = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
_CHUNK = 1024 * 1024


class RemoteError(BaseModel):
    """One entry of a remote batch's ``errors.data`` (validation errors; ``line`` 1-based)."""

    model_config = ConfigDict(extra="ignore")
    code: str | None = None
    message: str | None = None
    line: int | None = None
    param: str | None = None


class RemoteErrors(BaseModel):
    model_config = ConfigDict(extra="ignore")
    data: list[RemoteError] = []


class RemoteCounts(BaseModel):
    model_config = ConfigDict(extra="ignore")
    total: int = 0
    completed: int = 0
    failed: int = 0


class RemoteBatch(BaseModel):
    """The fields of a remote ``Batch`` object this client reads (others are ignored)."""

    model_config = ConfigDict(extra="ignore")
    id: str
    status: BatchStatus
    input_file_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: RemoteErrors | None = None
    request_counts: RemoteCounts | None = None
    metadata: dict[str, Any] | None = None

    @property
    def terminal(self) -> bool:
        return self.status.terminal


def check_header_value(name: str, value: str) -> str:
    """Refuse a header value that could split the request (CR, LF, NUL)."""
    if any(c in value for c in "\r\n\0"):
        raise ConfigurationError(f"{name} contains a line break or NUL")
    return value


class BatchAPI:
    """One remote Batch API root (``base_url`` ends in ``/v1``). Use as ``async with``.

    Each call is one attempt (the runner retries), but for the lookups made of several
    (:meth:`find`, the model of an uploaded file), which retry each of their calls with
    ``retrier``. ``timeout_s``: seconds without progress on one HTTP call (reading a body, or
    connecting) before it is a transient failure. ``flavor``: the provider's variant of the
    shape (:mod:`._flavors`; None: named by the base URL's host, else ``openai``).
    """

    page_size = 100
    """Batches asked for per page of the batch list (a server may send fewer)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 600.0,
        retrier: Retrier | None = None,
        flavor: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.flavor: FlavorSpec = flavor_of(flavor, self.base_url)
        self._models: dict[str, str] = {}  # uploaded file id -> its model (Mistral's create)
        self.display = redact_url(self.base_url)  # as shown and stored
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigurationError(f"base_url {self.display!r} is not an http(s) URL")
        self._headers = {
            k: check_header_value(f"header {k}", v) for k, v in (headers or {}).items()
        }
        if api_key:
            self._headers["Authorization"] = "Bearer " + check_header_value("api_key", api_key)
        self.retrier = retrier if retrier is not None else Retrier()
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> BatchAPI:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=self.timeout_s, sock_read=self.timeout_s
            )
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=timeout, trust_env=True
            )

    async def stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise ConfigurationError("the Batch API client is not open")
        return self._session

    # ------------------------------------------------------------------ one call, retried

    async def _once(
        self, method: str, path: str, read: Callable[[aiohttp.ClientResponse], Awaitable[T]],
        **kwargs: Any,
    ) -> T:  # fmt: skip
        try:
            async with self._http().request(method, self.base_url + path, **kwargs) as resp:
                if resp.status >= 300:
                    text = (await resp.read())[:2000].decode("utf-8", "replace")
                    wait = parse_retry_after(
                        resp.headers.get("Retry-After"), cap_s=self.retrier.retry.retry_after_cap_s
                    )
                    raise ApiError(
                        f"{method} {path}: HTTP {resp.status}: {_message(text)}",
                        status=resp.status,
                        transient=resp.status in _TRANSIENT,
                        retry_after_s=wait,
                    )
                return await read(resp)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(  # aiohttp's messages may quote the URL
                f"{method} {path}: {type(exc).__name__}: {redact_url(str(exc))}", transient=True
            ) from None

    async def _json(
        self, method: str, path: str, *, array: bool = False, **kwargs: Any
    ) -> dict[str, Any]:
        """A JSON object answer (``array``: a JSON array is accepted too, under ``"data"``)."""

        async def read(resp: aiohttp.ClientResponse) -> dict[str, Any]:
            try:
                data = await resp.json(content_type=None)
            except ValueError:
                data = None
            if array and isinstance(data, list):
                return {"data": data}
            if not isinstance(data, dict):
                raise ApiError(
                    f"{method} {path}: HTTP {resp.status} answer is not a JSON object",
                    status=resp.status,
                    transient=True,
                )
            return data

        return await self._once(method, path, read, **kwargs)

    async def _batch(self, method: str, path: str, **kwargs: Any) -> RemoteBatch:
        data = await self._json(method, path, **kwargs)
        try:
            return RemoteBatch.model_validate(normalize(self.flavor, data))
        except ValidationError as exc:
            raise ApiError(
                f"{method} {path}: not a Batch object: {str(exc)[:300]}", status=200, transient=True
            ) from None

    # ------------------------------------------------------------------ the calls

    async def upload(self, path: Path, filename: str) -> str:
        """Upload a batch input file (``purpose=batch``; Together: ``batch-api``), streamed from
        disk; its remote id. One attempt."""
        model = None
        if self.flavor.needs_model:  # a job's lines share one model (checked when it starts)
            model = await anyio.to_thread.run_sync(_first_model, path)
        f = await anyio.to_thread.run_sync(path.open, "rb")
        try:
            form = aiohttp.FormData()
            form.add_field("purpose", self.flavor.purpose)
            form.add_field("file", f, filename=filename, content_type="application/jsonl")
            data = await self._json("POST", "/files", data=form)
        finally:
            f.close()
        if not isinstance(data.get("id"), str):
            raise ApiError("POST /files: answer has no file id", status=200, transient=True)
        if model is not None:
            self._models[str(data["id"])] = model
        return str(data["id"])

    async def create(
        self, input_file_id: str, endpoint: str, completion_window: str, metadata: dict[str, str]
    ) -> RemoteBatch:
        """Create a batch: one attempt (a create is not idempotent; the runner looks for the
        batch before it tries again)."""
        model = None
        if self.flavor.needs_model:  # Mistral names the model per job, not per line
            model = self._models.get(input_file_id) or await self._remote_model(input_file_id)
        body = create_body(self.flavor, input_file_id, endpoint, completion_window, metadata, model)
        return await self._batch("POST", self.flavor.batches, json=body)

    async def _remote_model(self, file_id: str) -> str | None:
        """The model of an uploaded file's first line, read back from the server (a client that
        died between upload and create no longer has it)."""

        async def read(resp: aiohttp.ClientResponse) -> str | None:
            return _model_of(await resp.content.readline())

        model = await self.retrier.call(
            lambda: self._once("GET", f"/files/{file_id}/content", read)
        )
        if model is not None:
            self._models[file_id] = model
        return model

    async def retrieve(self, batch_id: str) -> RemoteBatch:
        """One attempt."""
        return await self._batch("GET", f"{self.flavor.batches}/{batch_id}")

    async def cancel(self, batch_id: str) -> RemoteBatch:
        """One attempt."""
        return await self._batch("POST", f"{self.flavor.batches}/{batch_id}/cancel")

    async def find(
        self, input_file_id: str, metadata: dict[str, str], pages: int = 20
    ) -> RemoteBatch | None:
        """The newest batch over ``input_file_id`` whose metadata includes ``metadata`` (looked
        up in at most ``pages`` pages of the batch list), or None. A flavour that keeps no
        metadata (Together) is matched on the input file alone: each part uploads its own."""
        cursor: str | None = None
        spec, path = self.flavor, self.flavor.batches
        for _ in range(pages):
            params = list_params(spec, cursor, self.page_size)
            page = await self.retrier.call(
                lambda p=params: self._json("GET", path, array=True, params=p)  # type: ignore[misc]
            )
            entries, cursor = read_page(spec, page, cursor, self.page_size)
            for entry in entries:
                try:
                    batch = RemoteBatch.model_validate(normalize(spec, entry))
                except (ValidationError, TypeError, AttributeError):
                    continue
                marks = batch.metadata or {}
                if batch.input_file_id == input_file_id and (
                    not spec.metadata or all(marks.get(k) == v for k, v in metadata.items())
                ):
                    return batch
            if cursor is None:
                return None
        return None

    async def download(self, file_id: str, dest: Path) -> int:
        """Stream a file's content to ``dest`` (replaced); the number of bytes. One attempt."""

        async def read(resp: aiohttp.ClientResponse) -> int:
            size = 0
            # created 0600 first (answers are as private as prompts); "wb" keeps the mode
            await anyio.to_thread.run_sync(lambda: os.close(os.open(dest, os.O_CREAT, 0o600)))
            async with await anyio.open_file(dest, "wb") as out:
                async for chunk in resp.content.iter_chunked(_CHUNK):
                    await out.write(chunk)
                    size += len(chunk)
            return size

        return await self._once("GET", f"/files/{file_id}/content", read)

    async def models(self) -> dict[str, dict[str, Any]] | None:
        """The served models (``GET /models``) by id, or None when the server cannot list
        them."""
        try:
            data = await self._json("GET", "/models")
        except ApiError:
            return None
        entries = data.get("data")
        if not isinstance(entries, list):
            return None
        return {str(e.get("id")): e for e in entries if isinstance(e, dict)}


def _first_model(path: Path) -> str | None:
    with path.open("rb") as f:
        return _model_of(f.readline())


def _model_of(line: bytes) -> str | None:
    """The ``body.model`` of one batch input line, or None."""
    try:
        body = json.loads(line).get("body")
    except (ValueError, AttributeError):
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


def _message(text: str) -> str:
    """The ``error.message`` of an OpenAI error body, else the text itself (shortened)."""
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300]
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])[:300]
    if isinstance(data, dict) and data.get("detail"):
        return str(data["detail"])[:300]
    return text[:300]
