"""The original protocol's routes (the "Batch Inference Support" request to Llama Stack,
``@webmethod(route="/batch-inference/...")``), over the same tenants and batches as ``/v1``:

- ``POST /batch-inference/chat-completion``: ``batch_chat_completion``'s arguments as a JSON
  body, ``BatchChatCompletionResponse`` back (one item per conversation, input order, per-item
  errors). At most ``max_sync_conversations`` per call; more is a 400 that points to the jobs.
- ``POST /batch-inference/jobs`` (``{"file_id", "completion_window", "metadata",
  "reuse_results_from"}`` -> ``Job``), ``GET /batch-inference/jobs/{job_id}`` (``JobStatus``, a
  JSON string), ``DELETE /batch-inference/jobs/{job_id}`` (cancel; ``null``),
  ``GET /batch-inference/jobs/{job_id}/result`` (``BatchChatCompletionResponse``; 409 until
  the job is finished), streamed a page at a time (chunked, without ``Content-Length``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from anyio import CapacityLimiter, to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict

from ..errors import ConfigurationError, JobStateError
from ..jobs._runner import parse_window
from ..types import (
    BatchChatCompletionResponse,
    JobStatus,
    LogProbConfig,
    ResponseFormat,
    SamplingParams,
    ToolChoice,
    ToolDefinition,
    ToolPromptFormat,
)
from ._body import read_model
from ._errors import APIError, clip, found, redact_paths, state_roots
from ._middleware import tenant_of
from ._routes_inference import until_disconnect

router = APIRouter(prefix="/batch-inference")


class BatchChatCompletionRequest(BaseModel):
    """The body of ``POST /batch-inference/chat-completion``: ``batch_chat_completion``'s
    arguments (``BatchInference.batch_chat_completion`` documents each). A conversation that is
    not a list of valid messages is that item's ``invalid_request`` error, not the call's."""

    model_config = ConfigDict(extra="forbid")

    model: str
    messages_batch: list[Any]
    sampling_params: SamplingParams | list[SamplingParams] | None = None
    tools: list[ToolDefinition | dict[str, Any]] | None = None
    tool_choice: ToolChoice | str = ToolChoice.auto
    tool_prompt_format: ToolPromptFormat | None = None
    response_format: ResponseFormat | list[ResponseFormat | None] | None = None
    logprobs: LogProbConfig | list[LogProbConfig | None] | None = None
    custom_ids: list[str] | None = None


class ScheduleBatchRequest(BaseModel):
    """The body of ``POST /batch-inference/jobs``: ``schedule_batch(file_id, **options)``."""

    model_config = ConfigDict(extra="forbid")

    file_id: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    reuse_results_from: str | None = None


@router.post("/chat-completion")
async def batch_chat_completion(request: Request) -> JSONResponse:
    client = tenant_of(request).client
    _, call = await read_model(request, BatchChatCompletionRequest)
    limit: int = request.app.state.max_sync_conversations
    if len(call.messages_batch) > limit:
        raise APIError(
            400,
            f"messages_batch has {len(call.messages_batch)} conversations; this server answers "
            f"at most {limit} per call (max_sync_conversations). Run more as a job: upload "
            "them as a batch file (POST /v1/files) and POST /batch-inference/jobs or "
            "/v1/batches.",
            param="messages_batch",
            code="too_many_conversations",
        )

    async def run() -> BatchChatCompletionResponse:
        return await client.batch_chat_completion(
            call.model,
            call.messages_batch,
            call.sampling_params,
            call.tools,
            call.tool_choice,
            call.tool_prompt_format,
            call.response_format,
            call.logprobs,
            custom_ids=call.custom_ids,
        )

    try:
        response = await until_disconnect(request, run)
    except ConfigurationError as exc:  # a whole-call argument: name it, as /v1 routes do
        raise APIError(400, str(exc), param=_argument(str(exc))) from None
    return JSONResponse(response.model_dump(mode="json"))


def _argument(message: str) -> str | None:
    """The argument a whole-call error is about: its messages begin with the argument's name
    ("sampling_params has 3 entries ...", "bad response_format: ...")."""
    head = message.removeprefix("bad ")
    if head.startswith("tool definition"):
        return "tools"
    name = head.split(" ", 1)[0].split(":", 1)[0]
    return name if name in BatchChatCompletionRequest.model_fields else None


@router.post("/jobs")
async def schedule_batch(request: Request) -> JSONResponse:
    client = tenant_of(request).client
    _, call = await read_model(request, ScheduleBatchRequest)
    options = call.model_dump(exclude={"file_id"}, exclude_none=True)
    try:
        parse_window(call.completion_window)
    except ValueError as exc:
        raise APIError(400, str(exc), param="completion_window") from None
    try:
        with found("file", call.file_id, "file_id"):
            if call.reuse_results_from is not None:
                with found("job", call.reuse_results_from, "reuse_results_from"):
                    await client.batches.retrieve(call.reuse_results_from)
            job = await client.schedule_batch(call.file_id, **options)
    except ConfigurationError as exc:  # metadata limits, a file that is not "batch"
        message = str(exc)
        param = "metadata" if message.startswith("metadata") else "file_id"
        raise APIError(400, message, param=param) from None
    return JSONResponse(job.model_dump(mode="json"))


@router.get("/jobs/{job_id}")
async def job_status(request: Request, job_id: str) -> JSONResponse:
    status = await tenant_of(request).client.job_status(job_id)
    if status is None:
        raise APIError(404, f"No such job: {clip(job_id)}", param="job_id")
    return JSONResponse(status.value)


@router.delete("/jobs/{job_id}")
async def job_cancel(request: Request, job_id: str) -> JSONResponse:
    with found("job", job_id, "job_id"):
        await tenant_of(request).client.job_cancel(job_id)
    return JSONResponse(None)


@router.get("/jobs/{job_id}/result")
async def job_result(request: Request, job_id: str) -> StreamingResponse:
    """The same document as ``JSONResponse(job_result(...))``, streamed page by page: a
    50,001-line result built whole took seconds of the event loop (every tenant waited) and
    hundreds of MiB. Each page is read and encoded in a worker thread; errors (404, 409) come
    before the first byte, from the first page. One worker thread at a time does this work
    for the whole server: the threads hold the GIL, and several at once starve the event
    loop (every other request) more than one does."""
    state = request.app.state
    if getattr(state, "result_limiter", None) is None:
        state.result_limiter = CapacityLimiter(1)
    limiter: CapacityLimiter = state.result_limiter
    client = tenant_of(request).client
    pages = client.job_result_pages(job_id, _PAGE, limiter)
    with found("job", job_id, "job_id"):
        try:
            first: list[Any] = await anext(pages, [])
        except JobStateError:
            status = await client.job_status(job_id)
            if status not in (JobStatus.scheduled, JobStatus.in_progress):
                raise  # a job that failed in validation: its own message says why
            raise APIError(
                409,
                f"job {job_id} is {status.value}: its result is ready once GET "
                f"/batch-inference/jobs/{job_id} answers completed, failed or cancelled",
                param="job_id",
                code="conflict",
            ) from None
    roots = state_roots(request)
    document = _document(first, pages, limiter, roots)
    return StreamingResponse(document, media_type="application/json")


_PAGE = 500  # items per page: a few ms of encoding, so other requests wait at most that long


async def _document(
    first: list[Any],
    pages: AsyncIterator[list[Any]],
    limiter: CapacityLimiter,
    roots: list[Path],
) -> AsyncIterator[bytes]:
    yield b'{"batch":['
    yield await to_thread.run_sync(_encode, first, True, roots, limiter=limiter)
    async for page in pages:
        yield await to_thread.run_sync(_encode, page, False, roots, limiter=limiter)
    yield b"]}"


def _encode(items: list[Any], first: bool, roots: list[Path]) -> bytes:
    """Items as JSONResponse encodes them (compact, UTF-8, no NaN), comma-separated; a leading
    comma unless they are the first (or there are none). An item's error message names no
    server path (a failed batch's stored error may: ``output_write_failed``)."""
    dumped = [i.model_dump(mode="json") for i in items]
    for item in dumped:
        error = item.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            error["message"] = redact_paths(error["message"], roots)
    text = ",".join(
        json.dumps(d, ensure_ascii=False, allow_nan=False, separators=(",", ":")) for d in dumped
    )
    return (text if first or not text else "," + text).encode()
