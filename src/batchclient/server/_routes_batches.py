"""``/v1/batches``: create (with ``Idempotency-Key``), retrieve, cancel, list (cursor pages), and
``resume`` (a batchclient extension). Objects are ``openai.types.Batch``; output and error files
are ``/v1/files`` objects with purpose ``batch_output``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from anyio import to_thread
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from .._core.client import BatchClient
from .._core.responses import serves
from ..errors import ConfigurationError, JobNotFoundError
from ..jobs._runner import parse_window
from ..types import Batch
from ._body import read_model
from ._errors import APIError, clip, found, redacted_batch, state_roots
from ._fair import check_priority
from ._idempotency import MAX_KEY_LENGTH, KeyReused, body_digest
from ._middleware import tenant_of
from ._routes_files import page

router = APIRouter(prefix="/v1")


class OutputExpiresAfter(BaseModel):
    """OpenAI's ``output_expires_after``: the output and error files expire ``seconds`` (one
    hour to 30 days) after the batch's ``created_at``."""

    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: int = Field(ge=3600, le=2_592_000)


class BatchCreate(BaseModel):
    """``POST /v1/batches`` (OpenAI's ``BatchCreateParams``). ``completion_window`` accepts any
    duration (``"24h"``, ``"30m"``; OpenAI only ``"24h"``). Without ``output_expires_after``
    the output and error files are kept until deleted."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    output_expires_after: OutputExpiresAfter | None = None


@router.post("/batches")
async def create_batch(
    request: Request,
    idempotency_key: Annotated[str | None, Header()] = None,
) -> JSONResponse:
    tenant = tenant_of(request)
    _, params = await read_model(request, BatchCreate)
    client = tenant.client
    served = sorted(e.value for e in serves(client.provider))
    if params.endpoint not in served:
        raise APIError(
            400,
            f"endpoint {params.endpoint[:100]!r} is not served here; served: {', '.join(served)}",
            param="endpoint",
        )
    try:
        parse_window(params.completion_window)
    except ValueError as exc:
        raise APIError(400, str(exc), param="completion_window") from None
    check_priority(params.metadata)
    if idempotency_key is None:
        batch = await _create(client, params)
        return JSONResponse(public(request, batch))
    if not 0 < len(idempotency_key) <= MAX_KEY_LENGTH:
        raise APIError(
            400,
            f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters",
            param="Idempotency-Key",
        )
    # the request as understood (defaults filled in), not as spelled: a retry that adds or
    # drops a defaulted field, or sends no metadata as {}, is the same request
    understood = params.model_dump(mode="json")
    understood["metadata"] = understood.get("metadata") or None
    if understood.get("output_expires_after") is None:  # keys recorded before it existed
        understood.pop("output_expires_after", None)
    digest = body_digest(understood)
    async with tenant.create_lock:  # a retry racing the first request waits for its batch
        try:
            known = await to_thread.run_sync(tenant.idempotency.lookup, idempotency_key, digest)
        except KeyReused:
            raise APIError(
                422,
                "this Idempotency-Key was used with another request body",
                param="Idempotency-Key",
                code="idempotency_key_reused",
            ) from None
        if known is not None:
            with found("batch", known, "batch_id"):
                batch = await client.batches.retrieve(known)
        else:
            batch = await _create(client, params)
            await to_thread.run_sync(tenant.idempotency.record, idempotency_key, digest, batch.id)
    return JSONResponse(public(request, batch))


def public(request: Request, batch: Batch) -> dict[str, Any]:
    """``batch`` as JSON for its tenant: its errors' messages name no server path (a failed
    output write or a failing state directory say which file as ``<state>/files/...``)."""
    return redacted_batch(batch, state_roots(request)).model_dump(mode="json")


async def _create(client: BatchClient, params: BatchCreate) -> Batch:
    try:
        with found("file", params.input_file_id, "input_file_id"):
            return await client.batches.create(
                params.input_file_id,
                endpoint=params.endpoint,
                completion_window=params.completion_window,
                metadata=params.metadata,
                output_expires_after_s=(
                    None
                    if params.output_expires_after is None
                    else params.output_expires_after.seconds
                ),
            )
    except ConfigurationError as exc:  # OpenAI's metadata limits, a file that is not "batch"
        message = str(exc)
        param = "metadata" if message.startswith("metadata") else "input_file_id"
        raise APIError(400, message, param=param) from None


@router.get("/batches/{batch_id}")
async def retrieve_batch(request: Request, batch_id: str) -> JSONResponse:
    with found("batch", batch_id, "batch_id"):
        batch = await tenant_of(request).client.batches.retrieve(batch_id)
    return JSONResponse(public(request, batch))


@router.post("/batches/{batch_id}/cancel")
async def cancel_batch(request: Request, batch_id: str) -> JSONResponse:
    """Cancel and answer once the batch is ``cancelled``: finished lines are kept in the
    output file, the rest fail with ``batch_cancelled``. 409 for a finished batch."""
    with found("batch", batch_id, "batch_id"):
        batch = await tenant_of(request).client.batches.cancel(batch_id)
    return JSONResponse(public(request, batch))


@router.post("/batches/{batch_id}/resume")
async def resume_batch(request: Request, batch_id: str) -> JSONResponse:
    """batchclient's extension: take up a batch that failed after validation (its output did
    not fit, its disk was full or read-only) once the cause is fixed; only lines without a
    result are sent, then its files are written. 409 for any other batch."""
    try:
        with found("batch", batch_id, "batch_id"):
            batch = await tenant_of(request).client.batches.resume(batch_id)
    except ConfigurationError:  # it ran on a provider with another identity (not shown)
        raise APIError(
            409, f"batch {batch_id!r} ran on another provider than this server's", code="conflict"
        ) from None
    return JSONResponse(public(request, batch))  # errors without server paths


@router.get("/batches")
async def list_batches(
    request: Request,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> JSONResponse:
    """Newest first, at most ``limit``, starting after the batch ``after`` (exclusive)."""
    batches = tenant_of(request).client.batches
    try:
        items = await batches.list(limit=limit + 1, after=after)
    except JobNotFoundError:  # an unknown cursor (or another tenant's)
        raise APIError(400, f"after: no batch {clip(after)}", param="after") from None
    shown = page(items[:limit], has_more=len(items) > limit, dump=lambda b: public(request, b))
    return JSONResponse(shown)
