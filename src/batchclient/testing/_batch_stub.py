"""A misbehaving OpenAI Batch API on loopback: ``/v1/files`` + ``/v1/batches`` (aiohttp.web).

It runs batches for real (uploaded files are parsed line by line, each line answered with the
echo stub's completion, output and error files written and served), and misbehaves on demand:
validation failures naming lines, HTTP errors on lines, batches that expire part-way with
partial output, lines missing from a completed batch's output, 5xx / 429 (with ``Retry-After``)
on polling, and creates whose answer is lost after the batch was created. Formats follow the
OpenAI Batch API reference (Batch object, output / error lines).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

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


class BatchAPIStub:
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
    """

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
    ) -> None:
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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # ------------------------------------------------------------------ routes

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_post("/v1/files", self._upload)
        app.router.add_get("/v1/files/{id}/content", self._content)
        app.router.add_post("/v1/batches", self._create)
        app.router.add_get("/v1/batches", self._list)
        app.router.add_get("/v1/batches/{id}", self._retrieve)
        app.router.add_post("/v1/batches/{id}/cancel", self._cancel)
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
        if purpose != "batch" or not path.exists():
            return _error(400, "need purpose=batch and a file", "invalid_request")
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
        return web.FileResponse(self._dir / file_id)

    async def _create(self, request: web.Request) -> web.Response:
        self.stats.creates += 1
        self.calls.append("create")
        body = await request.json()
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
        self.batches[batch_id] = _Batch(data, lines, bytes_in=len(raw))
        task = asyncio.get_running_loop().create_task(self._process(self.batches[batch_id]))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.lose_creates > 0:
            self.lose_creates -= 1
            return _error(502, "bad gateway (the batch was created)", "server_error")
        return web.json_response(data)

    async def _list(self, request: web.Request) -> web.Response:
        self.stats.lists += 1
        self.calls.append("list")
        limit = int(request.query.get("limit", "20"))
        ordered = sorted(self.batches.values(), key=lambda b: b.data["created_at"], reverse=True)
        ids = [b.data["id"] for b in ordered]
        after = request.query.get("after")
        start = ids.index(after) + 1 if after in ids else 0
        page = [b.data for b in ordered[start : start + limit]]
        more = start + limit < len(ids)
        return web.json_response({"object": "list", "data": page, "has_more": more})

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
        return web.json_response(batch.data)

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
        return web.json_response(batch.data)

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
        out: list[dict[str, Any]] = []
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
            out.append(_line(line, response, None))
            counts["completed"] += 1
        data["status"] = "finalizing" if final == "completed" else data["status"]
        for kind, lines in (("output", out), ("error", err)):
            if lines:
                file_id = f"file-{secrets.token_hex(8)}"
                text = "".join(json.dumps(x) + "\n" for x in lines)
                (self._dir / file_id).write_text(text)
                self.files[file_id] = {"id": file_id, "purpose": "batch_output"}
                data[f"{kind}_file_id"] = file_id
        data["status"] = final
        data[f"{final}_at"] = int(time.time())

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> BatchAPIStub:
        self._thread = threading.Thread(target=self._run, name="batch-stub", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("Batch API stub did not start within 10 s")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        loop.run_until_complete(self._serve())
        loop.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        runner = web.AppRunner(self._app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self._ready.set()
        try:
            await self._stopped.wait()
        finally:
            for task in list(self._tasks):
                task.cancel()
            await runner.cleanup()

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(10)
        for path in self._dir.glob("*"):
            path.unlink(missing_ok=True)
        self._dir.rmdir()

    def __enter__(self) -> BatchAPIStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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


def _error(status: int, message: str, code: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return web.json_response(body, status=status)
