"""Results <-> stored rows <-> lines of OpenAI batch output and error files.

The lines have the shape of the OpenAI Batch API's request output object
(https://platform.openai.com/docs/api-reference/batch/request-output): ``{"id", "custom_id",
"response": {"status_code", "request_id", "body"}, "error"}``. An API refusal keeps its HTTP
status and error body with ``"error": null``; a failure without an HTTP answer has ``"response":
null`` and ``error{code, message}``; an answer that failed batchclient's checks keeps its
response and carries ``error`` too, and goes to the error file. No line ever has status 200
without a ChatCompletion body (openai-openapi #302). Each row stores its finished line, so the
files at the end are a concatenation in input order.

Guide, with examples: ``docs/jobs.md`` ("Output and error files").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from .._core.completions import to_completion_response
from .._core.decode import to_response
from .._core.embeddings import as_requested, to_embedding_response
from .._core.request import Request, Result, item_error
from .._core.responses import answered, schemas, to_completion
from .._core.usage import TokenCounts, token_counts
from .._state import STORAGE_ERRORS
from ..errors import ErrorCode
from ..types import (
    ChatCompletionResponse,
    CompletionResponse,
    EmbeddingResponse,
    Endpoint,
    FileObject,
    ModerationResponse,
)
from ._lease import hold
from ._store import ResultRow, Store, now, open_private

ItemResponse = ChatCompletionResponse | CompletionResponse | EmbeddingResponse | ModerationResponse
"""The protocol's answer to one line, by the batch's endpoint."""


def _from_response(request: Request, result: Result) -> ChatCompletionResponse:
    """A ``/v1/responses`` line's answer as the chat protocol's response (checked as a chat
    answer is: structured output against ``text.format``, tool calls against the tools)."""
    if result.error is None and result.status_code is not None and 200 <= result.status_code < 300:
        completion = to_completion(result.body)
        body = completion if completion is not None else {"not a Response": result.body}
        result = Result(
            status_code=result.status_code,
            body=body,
            request_id=result.request_id,
            latency_s=result.latency_s,
            extra=result.extra,
        )
    return to_response(request, result)


def _moderation(request: Request, result: Result) -> ModerationResponse:
    """A ``/v1/moderations`` line's answer: its ``results``, or ``bad_upstream_response`` for
    an answer without a list of them."""
    if result.error is not None:
        return ModerationResponse(error=result.error, custom_id=request.custom_id)
    body = result.body or {}
    results = body.get("results")
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        error = item_error(
            ErrorCode.bad_upstream_response,
            f"answer without results: {json.dumps(body)[:300]}",
            status_code=result.status_code,
        )
        return ModerationResponse(error=error, custom_id=request.custom_id)
    metrics = [{"metric": "cached", "value": 1.0}] if result.cached else None
    return ModerationResponse.model_validate(
        {"results": results, "metrics": metrics, "custom_id": request.custom_id}
    )


_DECODE: dict[Endpoint, Callable[[Request, Result], ItemResponse]] = {
    Endpoint.chat_completions: to_response,
    Endpoint.completions: to_completion_response,
    Endpoint.embeddings: to_embedding_response,
    Endpoint.responses: _from_response,
    Endpoint.moderations: _moderation,
}


def request_for(
    seq: int, custom_id: str, body: dict[str, Any], endpoint: Endpoint = Endpoint.chat_completions
) -> Request:
    """The internal request for one input line, with the schemas its answer is checked
    against (``response_format.json_schema.schema``, or a Responses request's
    ``text.format.schema``; each tool's ``parameters``)."""
    if endpoint is Endpoint.responses:
        schema, tool_schemas = schemas(body)
    else:
        schema, tool_schemas = _chat_schemas(body)
    return Request(
        index=seq,
        body=body,
        endpoint=endpoint,
        custom_id=custom_id,
        response_schema=schema,
        tool_schemas=tool_schemas or None,
    )


def _chat_schemas(body: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    schema = None
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        inner = fmt.get("json_schema")
        if isinstance(inner, dict) and isinstance(inner.get("schema"), dict):
            schema = inner["schema"]
    tool_schemas: dict[str, Any] = {}
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            tool_schemas[fn["name"]] = params if isinstance(params, dict) else {}
    return schema, tool_schemas


def row_for(job_id: str, request: Request, result: Result) -> ResultRow:
    """The stored row of one finished request, with its output line. The verdict (``ok``) is
    the same as the synchronous call of the endpoint gives the item (``batch_chat_completion``,
    ``batch_completion``, ``batch_embeddings``): its decode without an error. A
    ``/v1/responses`` line answered on the chat path (a batch API that speaks only chat) is
    stored as the ``Response`` it stands for."""
    if request.endpoint is Endpoint.responses:
        result = answered(request, result)
    elif request.endpoint is Endpoint.embeddings:
        result = as_requested(request.body, result)
    response = _DECODE[request.endpoint](request, result)
    body = result.body
    usage = body.get("usage") if isinstance(body, dict) else None
    tokens_in = tokens_out = 0
    counts = TokenCounts()
    refused = result.status_code is not None and not 200 <= result.status_code < 300
    # a cache hit generated nothing; a refusal's body (kept as sent) counts for nothing
    if isinstance(usage, dict) and not result.cached and not refused:
        tokens_in = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
        tokens_out = _int(usage.get("completion_tokens", usage.get("output_tokens")))
        counts = token_counts(usage)
    request_id = result.request_id
    if request_id is None and isinstance(body, dict) and isinstance(body.get("id"), str):
        request_id = body["id"]
    row = ResultRow(
        seq=request.index,
        custom_id=request.custom_id or "",
        ok=response.error is None,
        status_code=result.status_code,
        body=body,
        error=result.error if result.error is not None else response.error,
        request_id=request_id,
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        cached=result.cached,
        latency_s=result.latency_s,
        cached_tokens=counts.cached,
        cache_write_tokens=counts.cache_write,
        reasoning_tokens=counts.reasoning,
    )
    return with_line(job_id, row)


def merged_row(job_id: str, answered: ResultRow, seq: int, custom_id: str) -> ResultRow:
    """The row of a line merged into an identical one: the same answer (and verdict, and
    ``cached`` mark) under its own ``seq`` and ``custom_id``; no tokens (nothing more was
    generated)."""
    row = ResultRow(
        seq=seq,
        custom_id=custom_id,
        ok=answered.ok,
        status_code=answered.status_code,
        body=answered.body,
        error=answered.error,
        request_id=answered.request_id,
        cached=answered.cached,
        merged=True,
        latency_s=answered.latency_s,
    )
    return with_line(job_id, row)


def with_line(job_id: str, row: ResultRow) -> ResultRow:
    """Set ``row.line``: compact UTF-8 JSON (orjson, several times faster than ``json`` for
    the bodies of a job; ``json`` for what orjson refuses, such as integers over 64 bits)."""
    line = output_line(job_id, row)
    try:
        row.line = orjson.dumps(line).decode()
    except TypeError:
        row.line = json.dumps(line, ensure_ascii=False, separators=(",", ":"))
    return row


MAX_TOKEN_COUNT = 2**32
"""The largest usage count credited to one request. An upstream's 2**70 (which no SQLite
INTEGER holds: the batch failed at every resume), infinity (JSON's 1e400), NaN, a negative
count or a string counts 0, and the answer itself is kept."""


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    count = int(value)
    return count if 0 <= count <= MAX_TOKEN_COUNT else 0


def response_for(row: ResultRow, endpoint: Endpoint = Endpoint.chat_completions) -> ItemResponse:
    """The protocol's response of a stored row (for ``job_result``): a
    ``ChatCompletionResponse``, ``CompletionResponse`` or ``EmbeddingResponse`` by the batch's
    endpoint."""
    result = Result(
        status_code=row.status_code,
        body=row.body,
        error=row.error,
        request_id=row.request_id,
        latency_s=row.latency_s,
        extra={"cached": True} if row.cached else {},
    )
    request = Request(index=row.seq, body={}, endpoint=endpoint, custom_id=row.custom_id)
    return _DECODE[endpoint](request, result)


def output_line(job_id: str, row: ResultRow) -> dict[str, Any]:
    """One line of the OpenAI batch output (or error) file."""
    line: dict[str, Any] = {"id": f"batch_req_{job_id.removeprefix('batch_')}_{row.seq}"}
    line["custom_id"] = row.custom_id
    error = None if row.error is None else {"code": row.error.code, "message": row.error.message}
    if row.status_code is not None and isinstance(row.body, dict):
        line["response"] = {
            "status_code": row.status_code,
            "request_id": row.request_id,
            "body": row.body,
        }
        # an API refusal is told by its status and body.error; only an answer that came back
        # 2xx and failed our checks carries an error next to its response
        line["error"] = error if (not row.ok and 200 <= row.status_code < 300) else None
    else:
        line["response"] = None
        line["error"] = error or {"code": "internal_error", "message": "no result recorded"}
    return line


def iter_output_lines(store: Store, job_id: str, *, ok: bool | None = None) -> Iterator[bytes]:
    """The job's output lines (``ok=True``), error lines (``ok=False``) or all, in input
    order, as encoded JSONL lines (streamed from SQLite, as stored)."""
    for line in store.iter_lines(job_id, ok=ok):
        yield line.encode() + b"\n"


def write_lines(lines: Iterator[bytes], path: Path) -> tuple[int, str]:
    """Write lines to ``path`` atomically (a temporary file in the same directory, then
    ``os.replace``); return (bytes written, SHA-256). On failure nothing is left behind and
    an older ``path`` is untouched."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    size = 0
    try:
        f = open_private(tmp)
        while not hold(f.fileno(), tmp):  # locked while written: the start-up sweep leaves it
            f.close()  # swept before it was locked: create it again
            f = open_private(tmp)
        with f:
            size = _copy(lines, f, digest)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno:  # name the file asked for, not the temporary
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    return size, digest.hexdigest()


def _copy(lines: Iterator[bytes], f: IO[bytes], digest: Any) -> int:
    size = 0
    buffer: list[bytes] = []
    for line in lines:
        buffer.append(line)
        if len(buffer) >= 512:
            chunk = b"".join(buffer)
            f.write(chunk)
            digest.update(chunk)
            size += len(chunk)
            buffer.clear()
    chunk = b"".join(buffer)
    f.write(chunk)
    digest.update(chunk)
    return size + len(chunk)


class OutputWriteError(Exception):
    """Writing a job's output or error file failed: ``path`` is the file, ``cause`` the OS or
    SQLite error."""

    def __init__(self, what: str, path: Path, cause: BaseException) -> None:
        self.path = path
        self.cause = cause
        if isinstance(cause, OSError) and cause.strerror:
            reason = f"[Errno {cause.errno}] {cause.strerror}"
        else:
            reason = f"{type(cause).__name__}: {cause}"
        super().__init__(f"could not write {what} {path}: {reason}")


def write_job_files(store: Store, job_id: str) -> tuple[str | None, str | None]:
    """Write the job's output and error files (purpose ``batch_output``) into the store;
    return their ids (None for a file that would be empty). Files of an earlier, interrupted
    attempt at this are replaced. Raises :class:`OutputWriteError` naming the file that could
    not be written (or recorded) and why."""
    ids: list[str | None] = []
    for ok, kind in ((True, "output"), (False, "error")):
        file_id = f"file-{job_id.removeprefix('batch_')}-{kind}"
        path = store.file_path(file_id)
        try:
            ids.append(_write_job_file(store, job_id, ok, kind, file_id, path))
        except STORAGE_ERRORS as exc:
            raise OutputWriteError(f"the {kind} file", path, exc) from exc
    return ids[0], ids[1]


def _write_job_file(
    store: Store, job_id: str, ok: bool, kind: str, file_id: str, path: Path
) -> str | None:
    with contextlib.suppress(KeyError):  # left by an interrupted earlier attempt
        store.delete_file(file_id)
    # the folder may have been removed under a long job: make it again (a file in its place
    # is an error to report, not to remove)
    path.parent.mkdir(parents=True, exist_ok=True)
    size, sha = write_lines(iter_output_lines(store, job_id, ok=ok), path)
    if size == 0:
        path.unlink(missing_ok=True)
        return None
    job = store.job_row(job_id)
    expires = None if job.output_expires_s is None else job.created_at + job.output_expires_s
    record = FileObject(
        id=file_id,
        bytes=size,
        created_at=now(),
        filename=f"{job_id}_{kind}.jsonl",
        purpose="batch_output",
        expires_at=expires,
    )
    store.add_file(record, sha)
    return file_id
