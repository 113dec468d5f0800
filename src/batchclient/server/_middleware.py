"""Two plain ASGI middlewares, outermost first:

- :class:`AccessLog`: one line per request on the ``batchclient.server`` logger, ``METHOD PATH
  STATUS MS`` (``POST /v1/batches 200 3.1 ms``). Never a header, a query string or a body, so
  never a key; control characters in the path are escaped so a path cannot forge log lines.
- :class:`Authenticate`: when keys are configured, every route (unknown ones included) needs
  ``Authorization: Bearer <key>``; otherwise 401 in OpenAI's envelope. The request's tenant is
  put in the scope for the routes (:func:`tenant_of`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._errors import error_response
from ._tenants import Tenant, Tenants

logger = logging.getLogger("batchclient.server")

TENANT_SCOPE_KEY = "batchclient.tenant"
ROUTE_SCOPE_KEY = "batchclient.route"
"""The template of a route a middleware answers itself (the status page's), for the metrics."""


class Observed:
    """ASGI middleware base: runs the app, then calls :meth:`observe` with each HTTP request's
    scope, its status (500 when the app failed before answering) and its duration in seconds."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.observe(scope, status, time.perf_counter() - started)

    def observe(self, scope: Scope, status: int, seconds: float) -> None:
        raise NotImplementedError


class AccessLog(Observed):
    def observe(self, scope: Scope, status: int, seconds: float) -> None:
        ms = seconds * 1000
        logger.info("%s %s %d %.1f ms", scope["method"], _printable(scope["path"]), status, ms)


def _printable(path: str, limit: int = 300) -> str:
    text = "".join(c if c.isprintable() and c != " " else f"\\x{ord(c):02x}" for c in path)
    return text if len(text) <= limit else text[:limit] + "..."


class Authenticate:
    def __init__(self, app: ASGIApp, tenants: Tenants) -> None:
        self.app = app
        self.tenants = tenants

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        tenant = self.tenants.authenticate(header)
        if tenant is None:
            message = (
                "Incorrect API key provided."
                if header is not None
                else "You didn't provide an API key: send Authorization: Bearer <key>."
            )
            response = error_response(
                401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
            )
            await response(scope, receive, send)
            return
        scope[TENANT_SCOPE_KEY] = tenant
        await self.app(scope, receive, send)


def tenant_of(request: Request) -> Tenant:
    """The tenant :class:`Authenticate` found for this request."""
    tenant: Any = request.scope[TENANT_SCOPE_KEY]
    assert isinstance(tenant, Tenant)
    return tenant
