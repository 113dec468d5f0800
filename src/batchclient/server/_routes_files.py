"""``/v1/files``: upload (multipart, streamed to disk), list (cursor pages), retrieve, download
(streamed from disk), delete. Objects are ``openai.types.FileObject`` / ``FileDeleted``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, JSONResponse
from starlette.types import Message, Receive, Scope, Send

from ..types import FileObject
from ._errors import APIError, clip, found
from ._middleware import tenant_of
from ._upload import receive_upload

router = APIRouter(prefix="/v1")

UPLOAD_PURPOSES = ("batch",)
"""Purposes a client may upload (batch input files); ``batch_output`` files are the server's."""


@router.post("/files")
async def create_file(request: Request) -> JSONResponse:
    tenant = tenant_of(request)
    files = tenant.client.files
    staged = await files.stage()
    try:
        upload = await receive_upload(request, staged, request.app.state.max_upload_bytes)
        if upload.file_parts == 0:
            raise APIError(400, "the upload has no 'file' part", param="file")
        unknown = sorted(set(upload.fields) - {"purpose"})
        if unknown:
            raise APIError(
                400,
                f"unsupported field(s) {unknown}: only 'file' and 'purpose' are accepted",
                param=unknown[0],
                code="unsupported_parameter",
            )
        purpose = upload.fields.get("purpose")
        if purpose is None:
            raise APIError(400, "missing required field 'purpose'", param="purpose")
        if purpose not in UPLOAD_PURPOSES:
            raise APIError(
                400,
                f"purpose {purpose[:64]!r} is not accepted here; use 'batch' (batch input files)",
                param="purpose",
            )
        record = await files.commit(staged, purpose=purpose, filename=upload.filename or "upload")
    finally:
        staged.discard()  # after a commit it does nothing
    return JSONResponse(record.model_dump(mode="json"))


@router.get("/files")
async def list_files(
    request: Request,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    purpose: str | None = None,
) -> JSONResponse:
    """OpenAI's cursor page: ``data`` newest first (``order=desc``) or oldest first, starting
    after the file ``after`` (exclusive)."""
    files = await tenant_of(request).client.files.list(purpose)
    if order == "asc":
        files.reverse()
    if after is not None:
        ids = [f.id for f in files]
        if after not in ids:
            raise APIError(400, f"after: no file {clip(after)} in this list", param="after")
        files = files[ids.index(after) + 1 :]
    return JSONResponse(page(files[:limit], has_more=len(files) > limit))


def page(
    items: list[Any], *, has_more: bool, dump: Callable[[Any], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """An OpenAI list object (``SyncCursorPage``): ``data`` (each item through ``dump``, by
    default its ``model_dump``), ``first_id``, ``last_id``, ``has_more``."""
    return {
        "object": "list",
        "data": [dump(item) if dump else item.model_dump(mode="json") for item in items],
        "first_id": items[0].id if items else None,
        "last_id": items[-1].id if items else None,
        "has_more": has_more,
    }


@router.get("/files/{file_id}")
async def retrieve_file(request: Request, file_id: str) -> JSONResponse:
    with found("file", file_id, "file_id"):
        record: FileObject = await tenant_of(request).client.files.retrieve(file_id)
    return JSONResponse(record.model_dump(mode="json"))


@router.get("/files/{file_id}/content")
async def file_content(request: Request, file_id: str) -> FileResponse:
    """The bytes, streamed from disk in chunks (Starlette's ``FileResponse``; ranges work)."""
    with found("file", file_id, "file_id"):
        path = await tenant_of(request).client.files.path(file_id)
    return _Download(path, media_type="application/octet-stream")


class _Download(FileResponse):
    """Starlette's ``FileResponse`` with its refusals of a ``Range`` header (plain text: 400
    malformed, 416 not satisfiable) raised as :class:`APIError`, answered in the envelope.
    Its own answers are only ever 200 and 206, so any other status is such a refusal."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal: dict[str, Any] = {}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] not in (200, 206):
                refusal.update(message, body=b"")
                return
            if not refusal:
                await send(message)
                return
            refusal["body"] += message.get("body", b"")
            if not message.get("more_body", False):
                raise _range_error(refusal)

        await super().__call__(scope, receive, sending)


def _range_error(refusal: dict[str, Any]) -> APIError:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in refusal["headers"]}
    if refusal["status"] == 416:
        size = headers.get("content-range", "bytes */?").rsplit("/", 1)[-1]
        return APIError(
            416,
            f"Range: no requested byte is within the file ({size} bytes)",
            code="range_not_satisfiable",
            headers={"Content-Range": f"bytes */{size}"},
        )
    reason = refusal["body"].decode("utf-8", "replace").strip().removeprefix("Range header: ")
    return APIError(
        refusal["status"], f"invalid Range header: {reason or 'malformed'}", code="invalid_range"
    )


@router.delete("/files/{file_id}")
async def delete_file(request: Request, file_id: str) -> JSONResponse:
    with found("file", file_id, "file_id"):
        deleted = await tenant_of(request).client.files.delete(file_id)
    return JSONResponse(deleted.model_dump(mode="json"))
