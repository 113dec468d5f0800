"""The original protocol's routes (the "Batch Inference Support" request to Llama Stack,
``@webmethod(route="/batch-inference/...")``), over the same tenants and batches as ``/v1``:

- ``POST /batch-inference/chat-completion``: ``batch_chat_completion``'s arguments as a JSON
  body, ``BatchChatCompletionResponse`` back (one item per conversation, input order, per-item
  errors). At most ``max_sync_conversations`` per call; more is a 400 that points to the jobs.
- ``POST /batch-inference/jobs`` (``{"file_id", "completion_window", "metadata",
  "reuse_results_from"}`` -> ``Job``), ``GET /batch-inference/jobs/{job_id}`` (``JobStatus``, a
  JSON string), ``DELETE /batch-inference/jobs/{job_id}`` (cancel; ``null``),
  ``GET /batch-inference/jobs/{job_id}/result`` (``BatchChatCompletionResponse``; 409 until
  the job is finished).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from ..types import (
    BatchChatCompletionResponse,
    LogProbConfig,
    ResponseFormat,
    SamplingParams,
    ToolChoice,
    ToolDefinition,
    ToolPromptFormat,
)
from ._body import read_model
from ._errors import APIError, found
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

    response = await until_disconnect(request, run)
    return JSONResponse(response.model_dump(mode="json"))


@router.post("/jobs")
async def schedule_batch(request: Request) -> JSONResponse:
    client = tenant_of(request).client
    _, call = await read_model(request, ScheduleBatchRequest)
    options = call.model_dump(exclude={"file_id"}, exclude_none=True)
    with found("file", call.file_id, "file_id"):
        if call.reuse_results_from is not None:
            with found("job", call.reuse_results_from, "reuse_results_from"):
                await client.batches.retrieve(call.reuse_results_from)
        job = await client.schedule_batch(call.file_id, **options)
    return JSONResponse(job.model_dump(mode="json"))


@router.get("/jobs/{job_id}")
async def job_status(request: Request, job_id: str) -> JSONResponse:
    status = await tenant_of(request).client.job_status(job_id)
    if status is None:
        raise APIError(404, f"No such job: {job_id!r}", param="job_id")
    return JSONResponse(status.value)


@router.delete("/jobs/{job_id}")
async def job_cancel(request: Request, job_id: str) -> JSONResponse:
    with found("job", job_id, "job_id"):
        await tenant_of(request).client.job_cancel(job_id)
    return JSONResponse(None)


@router.get("/jobs/{job_id}/result")
async def job_result(request: Request, job_id: str) -> JSONResponse:
    with found("job", job_id, "job_id"):
        result = await tenant_of(request).client.job_result(job_id)
    return JSONResponse(result.model_dump(mode="json"))
