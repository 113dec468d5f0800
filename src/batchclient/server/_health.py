"""``GET /health`` and ``GET /ready``, answered before authentication, and serving while the
app starts.

- ``/health``: 200 ``{"status": "ok"}`` whenever the process answers (no key needed, nothing
  else said): a liveness probe.
- ``/ready``: 503 ``{"status": "starting"}`` until the provider has started and every tenant's
  unfinished batches have been taken back up (the app's lifespan has finished starting), 200
  ``{"status": "ready"}`` from then on, 503 ``{"status": "stopping"}`` once it stops: a
  readiness probe (a load balancer sends traffic only to a ready server). With a shared
  PostgreSQL, a ready server also asks it (at most 2 s): 503 ``{"status":
  "database_unavailable"}`` while it does not answer.
- Every other route answers 503 ``server_starting`` (OpenAI's envelope, ``Retry-After: 1``)
  until the app is ready: the tenants' clients are not open before then.

:func:`serve_starting` is how ``batchclient serve`` uses it: the port opens at once (so probes
answer during a long engine start), the lifespan starts alongside.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from ._errors import envelope

STARTING = "starting"
READY = "ready"
DATABASE_UNAVAILABLE = "database_unavailable"
"""``/ready``'s status when the shared database does not answer (the server is up)."""
DATABASE_CHECK_S = 2.0
"""How long ``/ready`` waits for the shared database's answer, seconds."""
STOPPING = "stopping"

_STARTING_BODY = json.dumps(
    envelope(
        "the server is starting (the provider and interrupted batches); retry shortly",
        type="server_error",
        code="server_starting",
    )
).encode()


class Probes:
    """ASGI middleware: answers ``/health`` and ``/ready``, holds other requests at 503 until
    ``state.phase`` (the app's ``state``) is :data:`READY`."""

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        phase = getattr(self.state, "phase", STARTING)
        path = scope["path"]
        if path == "/health" and scope["method"] in ("GET", "HEAD"):
            await _answer(send, 200, b'{"status":"ok"}')
        elif path == "/ready" and scope["method"] in ("GET", "HEAD"):
            status = phase
            check = getattr(self.state, "database_check", None)
            if phase == READY and check is not None:
                try:
                    with anyio.fail_after(DATABASE_CHECK_S):
                        await check()
                except Exception:  # unreachable, or slower than a probe waits
                    status = DATABASE_UNAVAILABLE
            body = json.dumps({"status": status}, separators=(",", ":")).encode()
            await _answer(send, 200 if status == READY else 503, body)
        elif phase == STARTING:
            await _answer(send, 503, _STARTING_BODY, retry_after=True)
        else:
            await self.app(scope, receive, send)


async def _answer(send: Send, status: int, body: bytes, retry_after: bool = False) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
               (b"cache-control", b"no-store")]  # fmt: skip
    if retry_after:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def serve_starting(app: Any, server: Any, *others: Any) -> None:
    """Serve ``app`` (a :func:`~batchclient.server.create_app` app) on the uvicorn ``server``
    (configured with ``lifespan="off"``) while entering the app's lifespan alongside: probes
    answer from the first moment, the API once started. Returns when ``server`` stops (its
    signal handling: SIGTERM, Ctrl-C); the lifespan is then left (running batches paused).
    ``others``: more uvicorn servers (a metrics port) run and stopped with it. A failed start
    stops the servers and raises; a server that could not listen (uvicorn logged why and
    raised ``SystemExit``) stops the rest, and its ``SystemExit`` is raised once the app has
    stopped cleanly."""
    serving = [asyncio.ensure_future(_serve(s)) for s in (server, *others)]
    exits: list[SystemExit] = []
    try:
        async with app.router.lifespan_context(app):
            await asyncio.wait(serving, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for s in (server, *others):
            s.should_exit = True
        for task in serving:
            if (exit := await task) is not None:
                exits.append(exit)
    if exits:
        raise exits[0]


async def _serve(server: Any) -> SystemExit | None:
    # caught here: a SystemExit escaping a task would stop the event loop at once, leaving the
    # app's lifespan (running batches, the provider) without its clean exit
    try:
        await server.serve()
    except SystemExit as exc:
        return exc
    return None
