"""A misbehaving OpenAI Batch API on loopback: ``/v1/files`` + ``/v1/batches`` (aiohttp.web).

It runs batches for real (uploaded files are parsed line by line, each line answered with the
echo stub's completion, output and error files written and served), and misbehaves on demand:
validation failures naming lines, HTTP errors on lines, batches that expire part-way with
partial output, lines missing from a completed batch's output, 5xx / 429 (with ``Retry-After``)
on polling, creates whose answer is lost after the batch was created, and malformed output
lines. Formats follow the OpenAI Batch API reference (Batch object, output / error lines).

``flavor="together" | "groq" | "mistral"`` speaks that provider's variant instead (what its
reference documents; ``docs/batch-api.md``): Together's upper-case statuses, ISO-8601
timestamps, ``batch-api`` file purpose, ``{"job": ...}`` create answer and unpaged array list;
Groq's 24 h to 7 d windows; Mistral's ``/v1/batch/jobs`` with its own job states, field names
and numbered pages. Batches are kept in OpenAI's shape inside and rendered per flavour.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from ._loopback import LoopbackApp
from ._stub import StubReply, _text_of, completion_body

__all__ = ["BatchAPIStub", "BatchStubStats"]


@dataclass
class BatchStubStats:
    """What the stub saw: ``uploads`` and ``creates`` (``POST /files``, ``POST /batches``
    answered or not), ``polls`` (``GET /batches/{id}``), ``lists``, ``cancels``,
    ``downloads``, and ``lines`` (request lines in created batches)."""

    uploads: int = 0
    creates: int = 0
    polls: int = 0
    lists: int = 0
    cancels: int = 0
    downloads: int = 0
    lines: int = 0
    by_status: Counter[int] = field(default_factory=Counter)


@dataclass
class _Batch:
    data: dict[str, Any]
    lines: list[dict[str, Any]]
    bytes_in: int = 0
    cancel: bool = False
    order: int = 0  # creation order: batches made within one second still list newest first


class BatchAPIStub(LoopbackApp):
    """The Batch API stub on ``127.0.0.1`` in a background thread (``with`` or ``start()`` /
    ``stop()``); ``url`` ends in ``/v1``.

    Args:
        line_delay_s: seconds to answer each line (lines of one batch run one after another;
            batches run at once).
        refuse_match: lines whose message text contains this fail validation: the batch is
            ``failed`` with one ``errors.data`` entry per such line (1-based ``line``).
        error_match: lines containing this are answered HTTP 400 (in the error file).
        omit_match: lines containing this are missing from a completed batch's output.
        expire_after: a batch expires after answering this many lines; the rest go to the
            error file as ``batch_expired`` (OpenAI's behaviour).
        poll_faults: answers to the first ``GET /batches/{id}`` calls, in order (e.g.
            ``StubReply(status=429, headers={"Retry-After": "1"})``).
        lose_creates: the first N ``POST /batches`` create the batch, then answer 502.
        models: model names listed by ``GET /v1/models``.
        api_key: when set, every call needs ``Authorization: Bearer <api_key>`` (else 401).
        flavor: ``"openai"`` (default), ``"together"``, ``"groq"`` or ``"mistral"``.
        page_cap: the most batches one page of the batch list holds, whatever was asked.
        odd_status: a status word no reference lists, reported instead of the running state
            by the first ``odd_polls`` polls of each batch (which does not finish before they
            are answered, however slowly the client polls).
        create_delay_s: seconds a create waits, the batch already made, before it answers
            (a client killed meanwhile sent a create whose answer it never saw).
        download_delay_s: seconds a file download waits before it answers (a client killed
            meanwhile was collecting).
        malformed: lines containing a key get a malformed output line of that kind:
            ``object`` (a JSON array), ``custom_id`` (no ``custom_id``), ``body`` (a body that
            is not a JSON object), ``usage`` (a token count of 2**70) or ``json`` (a line that
            is not JSON).
    """

    _name = "batch-stub"

    def __init__(
        self,
        *,
        line_delay_s: float = 0.0,
        refuse_match: str | None = None,
        error_match: str | None = None,
        omit_match: str | None = None,
        expire_after: int | None = None,
        poll_faults: list[StubReply] | None = None,
        lose_creates: int = 0,
        models: tuple[str, ...] = ("smollm2",),
        api_key: str | None = None,
        flavor: str = "openai",
        page_cap: int | None = None,
        odd_status: str | None = None,
        odd_polls: int = 0,
        malformed: dict[str, str] | None = None,
        create_delay_s: float = 0.0,
        download_delay_s: float = 0.0,
    ) -> None:
        super().__init__()
        self.malformed = dict(malformed or {})
        self.create_delay_s = create_delay_s
        self.download_delay_s = download_delay_s
        if flavor not in ("openai", "together", "groq", "mistral"):
            raise ValueError(f"unknown flavor {flavor!r}")
        self.flavor = flavor
        self.page_cap = page_cap
        self.odd_status = odd_status
        self.odd_polls = odd_polls
        self.created: list[dict[str, Any]] = []
        """Every create request body, in arrival order."""
        self.line_delay_s = line_delay_s
        self.refuse_match = refuse_match
        self.error_match = error_match
        self.omit_match = omit_match
        self.expire_after = expire_after
        self.poll_faults = list(poll_faults or [])
        self.lose_creates = lose_creates
        self.models = models
        self.api_key = api_key
        self.stats = BatchStubStats()
        self.poll_times: list[float] = []
        """``time.monotonic()`` of every ``GET /batches/{id}``."""
        self.calls: list[str] = []
        """Every call in arrival order: ``upload``, ``create``, ``poll``, ``list``, ``cancel``,
        ``download``."""
        self.batches: dict[str, _Batch] = {}
        self.files: dict[str, dict[str, Any]] = {}
        self._dir = Path(tempfile.mkdtemp(prefix="batch-stub-"))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # ------------------------------------------------------------------ routes

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_post("/v1/files", self._upload)
        app.router.add_get("/v1/files/{id}/content", self._content)
        root = "/v1/batch/jobs" if self.flavor == "mistral" else "/v1/batches"
        app.router.add_post(root, self._create)
        app.router.add_get(root, self._list)
        app.router.add_get(root + "/{id}", self._retrieve)
        app.router.add_post(root + "/{id}/cancel", self._cancel)
        app.router.add_get("/v1/models", self._models)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error(401, "invalid api key", "invalid_api_key")
        response: web.StreamResponse = await handler(request)
        self.stats.by_status[response.status] += 1
        return response

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "owned_by": "stub"} for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _upload(self, request: web.Request) -> web.Response:
        self.stats.uploads += 1
        self.calls.append("upload")
        file_id = f"file-{secrets.token_hex(8)}"
        path = self._dir / file_id
        size, purpose, name = 0, None, "upload.jsonl"
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if getattr(part, "name", None) == "purpose":
                purpose = (await part.read()).decode()  # type: ignore[union-attr]
            elif getattr(part, "name", None) == "file":
                name = getattr(part, "filename", None) or name
                with path.open("wb") as out:  # small test files: blocking writes are fine
                    while chunk := await part.read_chunk():  # type: ignore[union-attr]
                        out.write(chunk)
                        size += len(chunk)
        want = "batch-api" if self.flavor == "together" else "batch"
        if purpose != want or not path.exists():
            return _error(400, f"need purpose={want} and a file", "invalid_request")
        record = {
            "id": file_id, "object": "file", "bytes": size, "created_at": int(time.time()),
            "filename": name, "purpose": "batch", "status": "processed",
        }  # fmt: skip
        self.files[file_id] = record
        return web.json_response(record)

    async def _content(self, request: web.Request) -> web.StreamResponse:
        file_id = request.match_info["id"]
        if file_id not in self.files:
            return _error(404, f"no file {file_id}", "not_found")
        self.stats.downloads += 1
        self.calls.append("download")
        if self.download_delay_s:
            await self._hold(self.download_delay_s)
        return web.FileResponse(self._dir / file_id)

    async def _create(self, request: web.Request) -> web.Response:
        self.stats.creates += 1
        self.calls.append("create")
        body = await request.json()
        self.created.append(body)
        refused = self._refuse_create(body)
        if refused is not None:
            return _error(400, refused, "invalid_request")
        if self.flavor == "mistral":
            file_id = (body.get("input_files") or [None])[0]
            body["completion_window"] = f"{body.get('timeout_hours', 24)}h"
        else:
            file_id = body.get("input_file_id")
        if file_id not in self.files:
            return _error(400, f"no file {file_id}", "invalid_request")
        raw = (self._dir / file_id).read_bytes()
        lines = [json.loads(x) for x in raw.splitlines() if x.strip()]
        self.stats.lines += len(lines)
        now = int(time.time())
        batch_id = f"batch_{secrets.token_hex(8)}"
        data = {
            "id": batch_id, "object": "batch", "endpoint": body.get("endpoint"),
            "errors": None, "input_file_id": file_id,
            "completion_window": body.get("completion_window"), "status": "validating",
            "output_file_id": None, "error_file_id": None, "created_at": now,
            "expires_at": now + 86400, "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": body.get("metadata"),
        }  # fmt: skip
        self.batches[batch_id] = _Batch(data, lines, bytes_in=len(raw), order=len(self.batches))
        task = asyncio.get_running_loop().create_task(self._process(self.batches[batch_id]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.create_delay_s:
            await self._hold(self.create_delay_s)
        if self.lose_creates > 0:
            self.lose_creates -= 1
            return _error(502, "bad gateway (the batch was created)", "server_error")
        shown = self._render(data)
        return web.json_response(
            {"job": shown, "warning": None} if self.flavor == "together" else shown
        )

    def _refuse_create(self, body: dict[str, Any]) -> str | None:
        """What the flavour's create refuses in ``body`` (None: nothing)."""
        if self.flavor == "mistral":
            hours = body.get("timeout_hours", 24)
            if not body.get("model") or not isinstance(hours, int) or not 1 <= hours <= 168:
                return "need a model and timeout_hours from 1 to 168"
            return None
        window = body.get("completion_window")
        if self.flavor == "groq":
            units = {"h": 3600, "d": 86400}
            try:
                text = str(window)
                seconds = float(text[:-1]) * units[text[-1]]
            except (TypeError, ValueError, KeyError, IndexError):
                return f"completion_window {window!r} is not a duration"
            return None if 86400 <= seconds <= 7 * 86400 else "completion_window: 24h to 7d"
        if self.flavor == "together" and "metadata" in body:
            return "unknown field metadata"
        return None

    def _render(self, data: dict[str, Any], *, poll: bool = False) -> dict[str, Any]:
        """A batch (kept in OpenAI's shape) as the flavour shows it."""
        status = data["status"]
        if poll and self.odd_status and status in ("validating", "in_progress"):
            seen = data.setdefault("_polls", 0)
            data["_polls"] = seen + 1
            if seen < self.odd_polls:
                status = self.odd_status
        shown = {k: v for k, v in data.items() if not k.startswith("_")}
        shown["status"] = status
        if self.flavor == "together":
            return _together(shown)
        if self.flavor == "mistral":
            return _mistral(shown)
        return shown

    async def _list(self, request: web.Request) -> web.Response:
        self.stats.lists += 1
        self.calls.append("list")
        ordered = sorted(
            self.batches.values(), key=lambda b: (b.data["created_at"], b.order), reverse=True
        )
        if self.flavor == "together":  # the whole list, as a bare array
            return web.json_response([self._render(b.data) for b in ordered])
        if self.flavor == "mistral":
            size = int(request.query.get("page_size", "100"))
            size = min(size, self.page_cap or size)
            number = int(request.query.get("page", "0"))
            chunk = ordered[number * size : (number + 1) * size]
            data = [self._render(b.data) for b in chunk]
            return web.json_response({"object": "list", "data": data, "total": len(ordered)})
        limit = int(request.query.get("limit", "20"))
        limit = min(limit, self.page_cap or limit)
        ids = [b.data["id"] for b in ordered]
        after = request.query.get("after")
        start = ids.index(after) + 1 if after in ids else 0
        page = [self._render(b.data) for b in ordered[start : start + limit]]
        more = start + limit < len(ids)
        last = page[-1]["id"] if page else None
        return web.json_response(
            {"object": "list", "data": page, "has_more": more, "last_id": last}
        )

    async def _retrieve(self, request: web.Request) -> web.Response:
        self.stats.polls += 1
        self.calls.append("poll")
        self.poll_times.append(time.monotonic())
        if self.poll_faults:
            fault = self.poll_faults.pop(0)
            raw = fault.raw if fault.raw is not None else json.dumps(fault.body or {}).encode()
            return web.Response(status=fault.status, body=raw, headers=fault.headers)
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return _error(404, "no such batch", "not_found")
        return web.json_response(self._render(batch.data, poll=True))

    async def _cancel(self, request: web.Request) -> web.Response:
        self.stats.cancels += 1
        self.calls.append("cancel")
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return _error(404, "no such batch", "not_found")
        if batch.data["status"] not in ("validating", "in_progress"):
            return _error(409, f"batch is {batch.data['status']}", "invalid_request")
        batch.cancel = True
        batch.data["status"] = "cancelling"
        batch.data["cancelling_at"] = int(time.time())
        return web.json_response(self._render(batch.data))

    # ------------------------------------------------------------------ running a batch

    async def _process(self, batch: _Batch) -> None:
        data = batch.data
        errors = [
            {"code": "invalid_request", "message": "refused by the stub", "line": n,
             "param": "body.messages"}
            for n, line in enumerate(batch.lines, start=1)
            if self.refuse_match and self.refuse_match in _text_of(line.get("body") or {})
        ]  # fmt: skip
        await asyncio.sleep(0.01)
        if errors:
            data.update(status="failed", failed_at=int(time.time()))
            data["errors"] = {"object": "list", "data": errors}
            return
        data.update(status="in_progress", in_progress_at=int(time.time()))
        counts = data["request_counts"]
        counts["total"] = len(batch.lines)
        out: list[Any] = []
        err: list[dict[str, Any]] = []
        final = "completed"
        for n, line in enumerate(batch.lines):
            if batch.cancel:
                final = "cancelled"
                break
            if self.expire_after is not None and n >= self.expire_after:
                final = "expired"
                for rest in batch.lines[n:]:
                    err.append(_line(rest, None, {"code": "batch_expired", "message": "expired"}))
                break
            if self.line_delay_s:
                await asyncio.sleep(self.line_delay_s)
            text = _text_of(line.get("body") or {})
            if self.omit_match and self.omit_match in text:
                counts["completed"] += 1
                continue
            if self.error_match and self.error_match in text:
                body = {"error": {"message": "refused line", "type": "invalid_request_error",
                                  "param": None, "code": "invalid_request"}}  # fmt: skip
                err.append(_line(line, {"status_code": 400, "body": body}, None))
                counts["failed"] += 1
                continue
            response = {"status_code": 200, "body": completion_body(line.get("body") or {})}
            out.append(_malformed(_line(line, response, None), self.malformed, text))
            counts["completed"] += 1
        # the odd polls are answered before the batch ends (counted in _render: no event to wait on)
        while self.odd_status and data.get("_polls", 0) < self.odd_polls and not batch.cancel:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        data["status"] = "finalizing" if final == "completed" else data["status"]
        for kind, lines in (("output", out), ("error", err)):
            if lines:
                file_id = f"file-{secrets.token_hex(8)}"
                text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
                (self._dir / file_id).write_text(text)
                self.files[file_id] = {"id": file_id, "purpose": "batch_output"}
                data[f"{kind}_file_id"] = file_id
        data["status"] = final
        data[f"{final}_at"] = int(time.time())

    # ------------------------------------------------------------------ lifecycle

    def _cleanup(self) -> None:
        for path in self._dir.glob("*"):
            path.unlink(missing_ok=True)
        self._dir.rmdir()


def _line(
    line: dict[str, Any], response: dict[str, Any] | None, error: dict[str, Any] | None
) -> dict[str, Any]:
    if response is not None:
        response = {"request_id": f"req_{secrets.token_hex(6)}", **response}
    return {
        "id": f"batch_req_{secrets.token_hex(6)}",
        "custom_id": line.get("custom_id"),
        "response": response,
        "error": error,
    }


def _malformed(line: dict[str, Any], kinds: dict[str, str], text: str) -> Any:
    """``line`` as the malformed kind its text asks for (``kinds``), else as it is."""
    kind = next((k for m, k in kinds.items() if m in text), None)
    if kind == "object":
        return [line["custom_id"]]
    if kind == "custom_id":
        return {k: v for k, v in line.items() if k != "custom_id"}
    if kind == "body":
        line["response"]["body"] = "{not json"
    if kind == "usage":
        line["response"]["body"]["usage"]["completion_tokens"] = 2**70
    if kind == "json":
        return json.dumps(line)[:-7]  # torn: not JSON
    return line


_MISTRAL_STATES = {
    "validating": "QUEUED", "in_progress": "RUNNING", "finalizing": "RUNNING",
    "completed": "SUCCESS", "failed": "FAILED", "expired": "TIMEOUT_EXCEEDED",
    "cancelling": "CANCELLATION_REQUESTED", "cancelled": "CANCELLED",
}  # fmt: skip


def _iso(value: Any) -> Any:
    if not isinstance(value, int):
        return value
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _together(data: dict[str, Any]) -> dict[str, Any]:
    """A batch as Together's ``BatchJob``: upper-case status, ISO-8601 times, ``progress``."""
    counts = data.get("request_counts") or {}
    total = counts.get("total") or 0
    done = (counts.get("completed") or 0) + (counts.get("failed") or 0)
    status = data["status"]
    errors = (data.get("errors") or {}).get("data") or []
    return {
        "id": data["id"], "user_id": "user_stub", "input_file_id": data["input_file_id"],
        "status": "IN_PROGRESS" if status == "finalizing" else status.upper(),
        "job_deadline": _iso(data.get("expires_at")), "created_at": _iso(data.get("created_at")),
        "completed_at": _iso(data.get("completed_at")), "endpoint": data.get("endpoint"),
        "progress": 100.0 * done / total if total else 0.0, "model_id": None,
        "output_file_id": data.get("output_file_id"), "error_file_id": data.get("error_file_id"),
        "error": "; ".join(str(e.get("message")) for e in errors) or None,
    }  # fmt: skip


def _mistral(data: dict[str, Any]) -> dict[str, Any]:
    """A batch as Mistral's ``BatchJobOut``."""
    counts = data.get("request_counts") or {}
    errors = (data.get("errors") or {}).get("data") or []
    status = data["status"]
    return {
        "id": data["id"], "object": "batch", "input_files": [data["input_file_id"]],
        "metadata": data.get("metadata"), "endpoint": data.get("endpoint"), "model": None,
        "output_file": data.get("output_file_id"), "error_file": data.get("error_file_id"),
        "errors": [{"message": str(e.get("message")), "count": 1} for e in errors],
        "status": _MISTRAL_STATES.get(status, status), "created_at": data.get("created_at"),
        "total_requests": counts.get("total", 0),
        "completed_requests": counts.get("completed", 0) + counts.get("failed", 0),
        "succeeded_requests": counts.get("completed", 0),
        "failed_requests": counts.get("failed", 0),
        "started_at": data.get("in_progress_at"), "completed_at": data.get(f"{status}_at"),
    }  # fmt: skip


def _error(status: int, message: str, code: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return web.json_response(body, status=status)
