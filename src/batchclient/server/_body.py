"""JSON request bodies: read with a size cap, parsed, validated into a pydantic model; every
problem is a 400 (413 for the size) in OpenAI's envelope."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from ._errors import APIError

M = TypeVar("M", bound=BaseModel)


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, at most ``app.state.max_body_bytes`` bytes."""
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
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    message = first["msg"]
    return APIError(400, f"{param}: {message}" if param else message, param=param)


def _too_large(limit: int) -> APIError:
    return APIError(
        413, f"the body is over this server's limit of {limit} bytes (max_body_bytes)",
        code="request_too_large",
    )  # fmt: skip
