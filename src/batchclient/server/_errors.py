"""Errors in OpenAI's envelope, ``{"error": {"message", "type", "param", "code"}}``, with the
HTTP status OpenAI uses (400 bad request, 401 bad key, 404 unknown id or route, 409 a state that
forbids the call, 413 too large, 422 an idempotency key reused with another body; 507 and 503
when the state directory is full or cannot be written).

Every failure a request can cause ends here: :class:`APIError` raised by the routes,
FastAPI's validation errors (query parameters; 422 there, 400 here, as OpenAI answers),
Starlette's 404 / 405, batchclient's own exceptions, and anything unexpected (500, logged with
its traceback in the server's log; the client gets the envelope, never a traceback).

What a client sent is echoed at most :data:`ECHO_LIMIT` characters long (:func:`clip`; a 5 MB
id does not come back in a 5 MB 404), and no message names a path of the server's: the state
directory is written ``<state>`` (:func:`redact_paths`), any other absolute path ``<path>``.
"""

from __future__ import annotations

import errno
import logging
import re
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .._invalid import first_problem
from .._state import DB_ERRORS
from ..errors import (
    ClientClosedError,
    ConfigurationError,
    FileNotFoundInStoreError,
    JobNotFoundError,
    JobStateError,
    ModelNotFoundError,
)
from ..types import Batch

logger = logging.getLogger("batchclient.server")

INVALID_REQUEST = "invalid_request_error"
ECHO_LIMIT = 200
"""Most characters of a client's input (an id, a path, a field name) echoed in a message."""
MESSAGE_LIMIT = 4000
"""Most characters of any error message this server sends."""
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/<>-])/[^\s'\",:;()\[\]]+")
_API_PATH = re.compile(r"/v1(?:/[\w.{}-]+)*/?")
"""An API URL (``/v1/chat/completions``, ``/v1/batches/{id}``): said as it is, not a file."""


def clip(value: object, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)`` of a client's input, cut to ``limit`` characters (saying how long it
    was)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def redact_paths(text: str, roots: Sequence[Path] = ()) -> str:
    """``text`` without absolute paths: each of ``roots`` (the state directories) becomes
    ``<state>`` (so ``<state>/files/...`` still says which file), any other absolute path
    ``<path>``, except the API's own URLs (``/v1/...``). For messages sent to clients; the
    server's log keeps the real paths."""
    for root in sorted({str(r) for r in roots} | {str(r.resolve()) for r in roots}, key=len)[::-1]:
        if root not in ("", "/"):
            text = text.replace(root, "<state>")
    return _ABSOLUTE_PATH.sub(_file_path, text)


def _file_path(match: re.Match[str]) -> str:
    path = match.group(0)
    return path if _API_PATH.fullmatch(path) else "<path>"


def redacted_batch(batch: Batch, roots: Sequence[Path]) -> Batch:
    """``batch`` with its errors' messages through :func:`redact_paths` (a failed output write
    or a failing state directory say which file as ``<state>/files/...``)."""
    if not batch.errors or not batch.errors.data:
        return batch
    data = [
        e.model_copy(update={"message": redact_paths(e.message, roots)}) if e.message else e
        for e in batch.errors.data
    ]
    return batch.model_copy(update={"errors": batch.errors.model_copy(update={"data": data})})


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
    if len(message) > MESSAGE_LIMIT:
        message = message[:MESSAGE_LIMIT] + "..."
    if param is not None and len(param) > ECHO_LIMIT:
        param = param[:ECHO_LIMIT] + "..."
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
        raise APIError(404, f"No such {kind}: {clip(object_id)}", param=param) from None


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
            message = f"Invalid URL ({request.method} {clip(request.url.path)[1:-1]})"
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {clip(request.url.path)[1:-1]}"
        else:
            message = str(exc.detail)
        headers = dict(exc.headers) if exc.headers else None
        return error_response(exc.status_code, message, headers=headers)

    async def library(request: Request, exc: Exception) -> JSONResponse:
        message = redact_paths(str(exc), state_roots(request))
        if message != str(exc):
            logger.warning("%s %s: %s", request.method, request.url.path, exc)
        if isinstance(exc, ModelNotFoundError):
            return error_response(
                404, message, type="not_found_error", param="model", code="model_not_found"
            )
        if isinstance(exc, JobStateError):
            return error_response(409, message, code="conflict")
        if isinstance(exc, FileNotFoundInStoreError | JobNotFoundError):
            return error_response(404, "No such object")
        if isinstance(exc, ClientClosedError):
            return error_response(503, "the server is not started", type="server_error")
        return error_response(400, message)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        if (storage := storage_response(exc)) is not None:
            logger.error("storage error on %s %s: %r", request.method, request.url.path, exc)
            return storage
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


_FULL = {errno.ENOSPC, errno.EDQUOT}
_UNWRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
_SQLITE_FULL, _SQLITE_UNWRITABLE = 13, {8, 10, 14}  # SQLITE_FULL; READONLY, IOERR, CANTOPEN


def storage_response(exc: BaseException) -> JSONResponse | None:
    """The answer when the state directory failed under a request: 507 ``storage_full`` (no
    space or quota left), 503 ``storage_unavailable`` (read-only, not permitted, I/O error);
    None for anything else. The message names no path (the log does)."""
    if isinstance(exc, OSError):
        full, unwritable = exc.errno in _FULL, exc.errno in _UNWRITABLE
    elif isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", -1) & 0xFF  # the primary result code
        full, unwritable = code == _SQLITE_FULL, code in _SQLITE_UNWRITABLE
    elif isinstance(exc, DB_ERRORS):  # PostgreSQL: SQLSTATE classes 53 (resources), 08, 57P
        state = str(getattr(exc, "sqlstate", None) or "")
        full = state == "53100"  # disk_full
        unwritable = not full and (
            state.startswith(("08", "57P", "53", "25006"))
            or type(exc).__name__ == "OperationalError"
        )
    else:
        return None
    if full:
        message = "the server's storage is full: the request was not carried out; try later"
        return error_response(507, message, type="server_error", code="storage_full")
    if unwritable:
        message = "the server's storage cannot be written now: the request was not carried out"
        return error_response(503, message, type="server_error", code="storage_unavailable")
    return None


def state_roots(request: Request) -> list[Path]:
    """The state directories :func:`redact_paths` hides from this app's clients."""
    tenants = getattr(request.app.state, "tenants", None)
    if tenants is None:
        return []
    return tenants.state_dirs()  # type: ignore[no-any-return]


def validation_response(errors: Any) -> JSONResponse:
    """A 400 naming the first invalid field (pydantic / FastAPI error list)."""
    param, message = first_problem(errors or [], drop=("body", "query", "path", "header"))
    param = param[:ECHO_LIMIT] if param else None
    return error_response(400, f"{param}: {message}" if param else message, param=param)
