"""JSON request bodies: read with a size cap, parsed, validated into a pydantic model; every
problem is a 400 (413 for the size, 415 for another ``Content-Type``) in OpenAI's envelope.

Only ``Content-Type: application/json`` is read: a web page can make a browser send
``text/plain``, ``multipart/form-data`` or ``application/x-www-form-urlencoded`` to any address
without asking first (a CORS "simple request"), but not ``application/json``. Refusing the
rest keeps a page from spending the upstream's key through a server without keys.
"""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from .._invalid import first_problem
from ._errors import ECHO_LIMIT, APIError

M = TypeVar("M", bound=BaseModel)


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, at most ``app.state.max_body_bytes`` bytes."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/json":
        shown = f"{kind[:ECHO_LIMIT]!r}" if kind else "none"
        raise APIError(
            415,
            f"the body must be sent as Content-Type: application/json (got {shown})",
            code="unsupported_media_type",
        )
    limit: int = request.app.state.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    data = bytearray()
    try:
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise _too_large(limit)
    except ClientDisconnect:
        raise APIError(400, "the client closed the connection during the request") from None
    if not data:
        raise APIError(400, "the request needs a JSON body")
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise APIError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise APIError(400, f"the body must be a JSON object, not {type(value).__name__}")
    return value


async def read_model(request: Request, model: type[M]) -> tuple[dict[str, Any], M]:
    """The body, and the body validated as ``model`` (400 naming the first bad field)."""
    body = await read_json(request)
    try:
        return body, model.model_validate(body)
    except ValidationError as exc:
        raise invalid(exc) from None


def invalid(exc: ValidationError) -> APIError:
    """A 400 naming the field as the client wrote it (no pydantic type names or links)."""
    param, message = first_problem(exc)
    param = param[:ECHO_LIMIT] if param else None
    return APIError(400, f"{param}: {message}" if param else message, param=param)


def _too_large(limit: int) -> APIError:
    return APIError(
        413, f"the body is over this server's limit of {limit} bytes (max_body_bytes)",
        code="request_too_large",
    )  # fmt: skip
