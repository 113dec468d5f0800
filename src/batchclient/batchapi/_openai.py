"""The OpenAI Files + Batches API, and the APIs shaped like it (Together, Groq, Mistral, another
``batchclient serve``), as a :class:`~._backend.RemoteBatchBackend`, over aiohttp.

- a part's file is uploaded (``POST /files``, multipart, streamed from disk), then a batch
  created over it (``POST /batches`` with ``metadata`` naming the job and part); a create whose
  answer was lost is found again in ``GET /batches`` (paged) by that metadata and the uploaded
  file (Together keeps no metadata: by the file alone, which is unique per part);
- polls read ``GET /batches/{id}``: ``validating`` / ``in_progress`` / ``finalizing`` run on,
  ``completed``, ``failed``, ``expired`` and ``cancelled`` have ended;
- results are the output and error files (``GET /files/{id}/content``, streamed to disk),
  already in the normalised shape; a line answered 429 or 5xx (or an error line saying the
  server could not be reached) is marked retryable. A ``failed`` batch has no files: its
  validation errors go to the lines they name (final), and every other line is retryable.

Requests go under their own ``custom_id`` (what the provider's console shows). How each flavour
departs from OpenAI's shape is translated in :mod:`._flavors`, so what is read here is always
OpenAI's ``Batch``. aiohttp rather than the openai SDK (``docs/design.md``): every retry is the
runner's, so a 429's ``Retry-After`` reaches its backoff, and files stream through a fixed
buffer.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import anyio
import orjson
from anyio import to_thread
from pydantic import ValidationError
from yarl import URL

from .._core.ledger import Billing
from .._core.prefix import PROMPT_CACHE_MIN_TOKENS, keys_prompt_caches, mark_shared_prefixes
from .._core.request import Request, Result, failed
from .._core.responses import Unsupported, from_chat, to_completion
from .._redact import redact_url
from .._routing.retry import RETRYABLE_STATUS
from ..errors import ConfigurationError, ErrorCode
from ..jobs._validate import RequestLine
from ..types import BatchStatus, Endpoint
from ._backend import RemoteState, check_header_value, error_line, json_lines, rest_line
from ._flavors import RemoteBatch, create_body, flavor_of, list_params, normalize, read_page
from ._options import BatchAPIOptions
from ._parts import Limits, batch_line, private_file
from ._retry import ApiError, Retrier

__all__ = ["OpenAIBackend"]

T = TypeVar("T")

_RUNNING = frozenset({BatchStatus.validating, BatchStatus.in_progress, BatchStatus.finalizing})
_RETRYABLE_CODES = frozenset(
    {"rate_limited", "server_error", "timeout", "connection_error", "endpoint_unavailable"}
)
"""Codes of an error line without a response that a later batch may not get (a
``batchclient serve`` writes them for an upstream it could not reach)."""
_CHUNK = 1024 * 1024
_FIND_PAGES = 20

_CHAT = Endpoint.chat_completions.value
_RESPONSES = Endpoint.responses.value


class OpenAIBackend:
    """One OpenAI-shaped Batch API root (``base_url`` ends in ``/v1``). Arguments as
    :class:`~batchclient.BatchAPIBatchInference`; ``max_lines`` / ``max_bytes`` None: the
    flavour's. ``spec``: the flavour (:mod:`._flavors`). Each call is one attempt, but
    :meth:`find`, which retries each page of the batch list.

    Raises:
        ConfigurationError: not an http(s) URL, a bad header or an unknown flavour.
    """

    name = "batch-api"
    endpoints: frozenset[Endpoint] = frozenset(Endpoint)
    page_size = 100
    """Batches asked for per page of the batch list (a server may send fewer)."""

    def __init__(self, base_url: str, api_key: str | None, options: BatchAPIOptions) -> None:
        self._url = base_url.rstrip("/")
        self.base_url = redact_url(self._url)  # as shown and stored
        if not self._url.startswith(("http://", "https://")):
            raise ConfigurationError(f"base_url {self.base_url!r} is not an http(s) URL")
        self.spec = flavor_of(options["flavor"], self._url)
        self.flavor = self.spec.name
        lines, size = options["max_lines"], options["max_bytes"]
        self.limits = Limits(lines or self.spec.max_lines, size or self.spec.max_bytes)
        self.retrier = Retrier(options["max_retries"], options["retry"])
        self._timeout_s = options["timeout_s"]
        headers = options["headers"] or {}
        self._headers = {k: check_header_value(f"header {k}", v) for k, v in headers.items()}
        if api_key:
            self._headers["Authorization"] = "Bearer " + check_header_value("api_key", api_key)
        self._session: aiohttp.ClientSession | None = None
        caching = options["prompt_caching"]
        if caching not in (True, False, "auto") or type(caching) not in (bool, str):
            raise ConfigurationError(
                f"prompt_caching must be 'auto', True or False, not {caching!r}"
            )
        origin = str(URL(self._url).origin())
        self.prompt_caching = caching is True or (caching == "auto" and keys_prompt_caches(origin))
        self.api = options["api"]
        self.output_expires_after_s = options["output_expires_after_s"]
        expiry = self.output_expires_after_s
        if expiry is not None and not 3600 <= expiry <= 2_592_000:
            raise ConfigurationError(
                "output_expires_after_s must be between 3600 and 2592000 seconds (OpenAI's "
                f"bounds: one hour to 30 days), not {expiry!r}"
            )
        if self.api not in ("chat", "responses"):
            raise ConfigurationError(f"api must be 'chat' or 'responses', not {self.api!r}")

    def identity(self) -> dict[str, Any]:
        identity: dict[str, Any] = {"provider": "batch-api", "base_url": self.base_url}
        if self.flavor != "openai":  # the default stays out: earlier calls keep their keys
            identity["flavor"] = self.flavor
        return identity

    async def start(self) -> None:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=self._timeout_s, sock_read=self._timeout_s
            )
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=timeout, trust_env=True
            )

    async def stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # ------------------------------------------------------------------ one HTTP call

    async def _once(
        self, method: str, path: str, read: Callable[[aiohttp.ClientResponse], Awaitable[T]],
        **kwargs: Any,
    ) -> T:  # fmt: skip
        if self._session is None:
            raise ConfigurationError("the Batch API client is not open")
        try:
            async with self._session.request(method, self._url + path, **kwargs) as resp:
                if resp.status >= 300:
                    text = (await resp.read())[:2000].decode("utf-8", "replace")
                    raise ApiError.http(
                        f"{method} {path}", resp.status, _message(text),
                        resp.headers.get("Retry-After"), self.retrier.retry.retry_after_cap_s,
                    )  # fmt: skip
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
            return RemoteBatch.model_validate(normalize(self.spec, data))
        except ValidationError as exc:
            raise ApiError(
                f"{method} {path}: not a Batch object: {str(exc)[:300]}", status=200, transient=True
            ) from None

    # ------------------------------------------------------------------ the backend

    async def _cards(self) -> dict[str, dict[str, Any]] | None:
        """The served models (``GET /models``) by id; None when the server cannot list them."""
        try:
            entries = (await self._json("GET", "/models")).get("data")
        except ApiError:
            return None
        if not isinstance(entries, list):
            return None
        return {str(e.get("id")): e for e in entries if isinstance(e, dict)}

    async def models(self) -> set[str] | None:
        cards = await self._cards()
        return None if cards is None else set(cards)

    async def context_length(self, model: str) -> int | None:
        limit = ((await self._cards()) or {}).get(model, {}).get("max_model_len")
        return limit if isinstance(limit, int) and not isinstance(limit, bool) else None

    def billing(self, model: str) -> Billing:
        """The batch tier; OpenAI caches prefixes of 1,024 tokens or more by itself, writes
        are plain input."""
        return Billing("batch", PROMPT_CACHE_MIN_TOKENS)

    def wire_id(self, line: RequestLine) -> str:
        return line.custom_id

    def encode(self, line: RequestLine, endpoint: str) -> bytes | Result:
        if self.api == "responses" and endpoint == _CHAT:
            try:
                body = from_chat(line.body)
            except Unsupported as exc:
                return failed(ErrorCode.unsupported_parameter, exc.message, param=exc.param)
            return batch_line(line.custom_id, _RESPONSES, body)
        return batch_line(line.custom_id, endpoint, line.body)

    async def upload(self, path: Path, lines: int, marks: dict[str, str]) -> str | None:
        """``POST /files`` (purpose ``batch``; Together: ``batch-api``), streamed from disk."""
        name = f"{marks.get('batchclient_job', 'batch')}-part{marks.get('batchclient_part', 0)}"
        keyed = await to_thread.run_sync(_with_cache_keys, path) if self.prompt_caching else None
        f = await to_thread.run_sync(path.open, "rb") if keyed is None else None
        try:
            form = aiohttp.FormData()
            form.add_field("purpose", self.spec.purpose)
            content = keyed if f is None else f
            form.add_field(
                "file", content, filename=f"{name}.jsonl", content_type="application/jsonl"
            )
            data = await self._json("POST", "/files", data=form)
        finally:
            if f is not None:
                f.close()
        if not isinstance(data.get("id"), str):
            raise ApiError("POST /files: answer has no file id", status=200, transient=True)
        return str(data["id"])

    async def submit(
        self, upload: str | None, path: Path, endpoint: str, window: str, marks: dict[str, str]
    ) -> str:
        assert upload is not None  # every part is uploaded first
        model = None
        if self.spec.needs_model:  # Mistral names the model per job, not per line
            model = await to_thread.run_sync(_first_model, path)
        if self.api == "responses" and endpoint == _CHAT:
            endpoint = _RESPONSES  # its lines were written as Responses requests (encode)
        body = create_body(self.spec, upload, endpoint, window, marks, model)
        if self.output_expires_after_s is not None and self.spec.name == "openai":
            seconds = self.output_expires_after_s
            body["output_expires_after"] = {"anchor": "created_at", "seconds": seconds}
        return (await self._batch("POST", self.spec.batches, json=body)).id

    async def find(
        self, upload: str | None, marks: dict[str, str], lines: int, since: float
    ) -> str | None:
        """The newest batch over ``upload`` whose metadata includes ``marks`` (a flavour that
        keeps none, Together: over ``upload`` alone), in the first pages of the batch list."""
        if upload is None:
            return None
        cursor: str | None = None
        spec = self.spec
        for _ in range(_FIND_PAGES):
            params = list_params(spec, cursor, self.page_size)
            page = await self.retrier.call(
                lambda p=params: self._json("GET", spec.batches, array=True, params=p)  # type: ignore[misc]
            )
            entries, cursor = read_page(spec, page, cursor, self.page_size)
            for entry in entries:
                try:
                    batch = RemoteBatch.model_validate(normalize(spec, entry))
                except (ValidationError, TypeError, AttributeError):
                    continue
                labels = batch.metadata or {}
                if batch.input_file_id == upload and (
                    not spec.metadata or all(labels.get(k) == v for k, v in marks.items())
                ):
                    return batch.id
            if cursor is None:
                return None
        return None

    async def poll(self, remote_id: str) -> RemoteState:
        return _state(await self._batch("GET", f"{self.spec.batches}/{remote_id}"))

    async def results(self, remote_id: str, dest: Path) -> None:
        batch = await self._batch("GET", f"{self.spec.batches}/{remote_id}")
        if batch.status == BatchStatus.failed:
            await to_thread.run_sync(_write_failure, batch, dest)
            return
        raw = dest.with_name(dest.name + ".raw")
        try:
            await to_thread.run_sync(lambda: private_file(dest).close())
            for file_id in (batch.output_file_id, batch.error_file_id):
                if file_id:
                    await self._once("GET", f"/files/{file_id}/content", _saved_to(raw))
                    as_chat = self.api == "responses"
                    await to_thread.run_sync(_append_marked, raw, dest, as_chat)
        finally:
            await anyio.Path(raw).unlink(missing_ok=True)

    async def cancel(self, remote_id: str) -> None:
        await self._batch("POST", f"{self.spec.batches}/{remote_id}/cancel")


def _saved_to(dest: Path) -> Callable[[aiohttp.ClientResponse], Awaitable[None]]:
    """How an answer's body is streamed to ``dest`` (replaced; mode 0600: answers are as
    private as prompts)."""

    async def save(resp: aiohttp.ClientResponse) -> None:
        await to_thread.run_sync(lambda: private_file(dest).close())  # "wb" keeps the mode
        async with await anyio.open_file(dest, "wb") as out:
            async for chunk in resp.content.iter_chunked(_CHUNK):
                await out.write(chunk)

    return save


def _state(batch: RemoteBatch) -> RemoteState:
    counts = batch.request_counts
    done = (counts.completed, counts.failed) if counts else (0, 0)
    if batch.status in _RUNNING:
        return RemoteState("in_progress", *done)
    if batch.status == BatchStatus.cancelling:
        return RemoteState("cancelling", *done)
    # an expired or cancelled batch's error file may leave out what it did not run
    return RemoteState(
        "ended",
        *done,
        cancelled=batch.status == BatchStatus.cancelled,
        partial=batch.status in (BatchStatus.expired, BatchStatus.cancelled),
    )


def _write_failure(batch: RemoteBatch, dest: Path) -> None:
    """A failed batch's errors as normalised lines: those naming a line are final (a
    validation error), every other line may go through in a new batch."""
    errors = batch.errors.data if batch.errors else []
    first = next((e for e in errors if e.line is None), errors[0] if errors else None)
    detail = f": {first.code}: {first.message}" if first else ""
    with private_file(dest) as out:
        for e in errors:
            if e.line is not None:
                code = e.code or "invalid_request"
                message = e.message or "the remote batch refused this line"
                out.write(error_line(e.line, code, message, param=e.param))
        message = f"the remote batch {batch.id} failed{detail}"
        out.write(rest_line("batch_failed", message, retryable=True))


def _append_marked(raw: Path, dest: Path, as_chat: bool = False) -> None:
    """Append the downloaded output or error file ``raw`` to ``dest``, each line a request
    may get otherwise in a later batch marked ``retryable``; with ``as_chat`` (chat lines sent
    as Responses requests), each ``Response`` answer as the chat completion it stands for."""
    with dest.open("ab") as out:
        for obj in json_lines(raw):
            if _retryable(obj):
                obj["retryable"] = True
            if as_chat:
                _response_as_chat(obj)
            out.write(orjson.dumps(obj) + b"\n")


def _response_as_chat(obj: Any) -> None:
    """An output line's ``Response`` body made the ``chat.completion`` it stands for; one that
    is not a usable ``Response`` is left as it came (its request's ``bad_upstream_response``
    when decoded as chat)."""
    response = obj.get("response") if isinstance(obj, dict) else None
    if not isinstance(response, dict):
        return
    body = response.get("body")
    if isinstance(body, dict) and body.get("object") == "response":
        completion = to_completion(body)
        if completion is not None:
            response["body"] = completion


def _retryable(obj: Any) -> bool:
    if not isinstance(obj, dict):
        return False
    response, error = obj.get("response"), obj.get("error")
    if isinstance(response, dict):
        return response.get("status_code") in RETRYABLE_STATUS
    return isinstance(error, dict) and error.get("code") in _RETRYABLE_CODES


def _with_cache_keys(path: Path) -> bytes | None:
    """A part's lines with a ``prompt_cache_key`` in the body of each chat line whose long
    prefix another line of the part shares (``_core.prefix.mark_shared_prefixes``, the rule of
    the remote fan-out); None when no line gets one (the file is uploaded as it is)."""
    lines = path.read_bytes().splitlines()
    parsed = [orjson.loads(line) for line in lines]
    requests = [
        Request(i, item["body"])
        for i, item in enumerate(parsed)
        if isinstance(item.get("body"), dict) and item.get("url") == Endpoint.chat_completions
    ]
    mark_shared_prefixes(requests)
    keyed = False
    for request in requests:
        body = request.body
        if request.prompt_cache_key is not None and "prompt_cache_key" not in body:
            body["prompt_cache_key"] = request.prompt_cache_key
            lines[request.index] = orjson.dumps(parsed[request.index])
            keyed = True
    return b"".join(line + b"\n" for line in lines) if keyed else None


def _first_model(path: Path) -> str | None:
    """The ``body.model`` of a part file's first line (a job's lines share one), or None."""
    with path.open("rb") as f:
        line = f.readline()
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
