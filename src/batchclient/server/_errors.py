"""Errors in OpenAI's envelope, ``{"error": {"message", "type", "param", "code"}}``, with the
HTTP status OpenAI uses (400 bad request, 401 bad key, 404 unknown id or route, 409 a state that
forbids the call, 413 too large, 422 an idempotency key reused with another body).

Every failure a request can cause ends here: :class:`APIError` raised by the routes,
FastAPI's validation errors (query parameters; 422 there, 400 here, as OpenAI answers),
Starlette's 404 / 405, batchclient's own exceptions, and anything unexpected (500, logged with
its traceback in the server's log; the client gets the envelope, never a traceback).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (
    ClientClosedError,
    ConfigurationError,
    FileNotFoundInStoreError,
    JobNotFoundError,
    JobStateError,
    ModelNotFoundError,
)

logger = logging.getLogger("batchclient.server")

INVALID_REQUEST = "invalid_request_error"


class APIError(Exception):
    """An answer other than success: ``status`` and the envelope's fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str = INVALID_REQUEST,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type
        self.headers = headers

    def response(self) -> JSONResponse:
        return error_response(
            self.status,
            self.message,
            param=self.param,
            code=self.code,
            type=self.type,
            headers=self.headers,
        )


def envelope(
    message: str, *, type: str = INVALID_REQUEST, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    *,
    type: str = INVALID_REQUEST,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        envelope(message, type=type, param=param, code=code), status_code=status, headers=headers
    )


@contextmanager
def found(kind: str, object_id: str, param: str) -> Iterator[None]:
    """Turn "no such file / batch" into a 404 naming only the id (the store's own message
    names the state directory, which is the server's business)."""
    try:
        yield
    except (FileNotFoundInStoreError, JobNotFoundError):
        raise APIError(404, f"No such {kind}: {object_id!r}", param=param) from None


def install_handlers(app: FastAPI) -> None:
    """Register the envelope for every exception a route can raise."""

    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return exc.response()

    async def validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return validation_response(exc.errors())

    async def http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        headers = dict(exc.headers) if exc.headers else None
        return error_response(exc.status_code, message, headers=headers)

    async def library(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, ModelNotFoundError):
            return error_response(
                404, str(exc), type="not_found_error", param="model", code="model_not_found"
            )
        if isinstance(exc, JobStateError):
            return error_response(409, str(exc), code="conflict")
        if isinstance(exc, FileNotFoundInStoreError | JobNotFoundError):
            return error_response(404, "No such object")
        if isinstance(exc, ClientClosedError):
            return error_response(503, "the server is not started", type="server_error")
        return error_response(400, str(exc))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # the ASGI server logs the traceback too: Starlette re-raises after this answer
        logger.error("internal error on %s %s: %r", request.method, request.url.path, exc)
        return error_response(
            500, "internal server error (see the server log)", type="server_error",
            code="internal_error",
        )  # fmt: skip

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http)
    for kind in (
        ModelNotFoundError,
        JobStateError,
        FileNotFoundInStoreError,
        JobNotFoundError,
        ClientClosedError,
        ConfigurationError,
    ):
        app.add_exception_handler(kind, library)
    app.add_exception_handler(Exception, unexpected)


def validation_response(errors: Any) -> JSONResponse:
    """A 400 naming the first invalid field (pydantic / FastAPI error list)."""
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
    param = ".".join(loc) or None
    message = str(first.get("msg", "invalid request"))
    return error_response(400, f"{param}: {message}" if param else message, param=param)
