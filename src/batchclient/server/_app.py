"""``create_app``: the FastAPI application of ``batchclient serve``, for uvicorn or for mounting
in another ASGI application."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from functools import partial

import anyio
from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response

from .._core.client import BatchClient
from .._core.provider import Provider
from .._state import Database
from ..errors import ConfigurationError
from ..jobs._store import DB_NAME
from ._errors import install_handlers
from ._guard import Guard
from ._health import READY, STARTING, STOPPING, Probes
from ._interrupted import Interrupted
from ._metrics import HTTPMetrics, MeteredProvider, Metrics
from ._middleware import AccessLog, Authenticate
from ._page import StatusPage
from ._routes_batches import router as batches_router
from ._routes_files import router as files_router
from ._routes_inference import router as inference_router
from ._routes_original import router as original_router
from ._tenants import Tenants
from ._webhooks import Webhook, delivering

logger = logging.getLogger("batchclient.server")

DEFAULT_MAX_UPLOAD_BYTES = 200 * 1024 * 1024
"""Largest accepted upload: 200 MiB (OpenAI's limit for a batch input file is 200 MB)."""
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""Largest JSON request body: 32 MiB (the longest batch line the validator accepts)."""
DEFAULT_MAX_SYNC_CONVERSATIONS = 1000
"""Most conversations in one ``POST /batch-inference/chat-completion``."""
DEFAULT_BODY_TIMEOUT = 30.0
"""Seconds of waiting for a request body in which it must bring at least 1 KiB."""


def create_app(
    target: Provider | BatchClient,
    *,
    state_dir: str | os.PathLike[str] | None = None,
    api_keys: Sequence[str] = (),
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_sync_conversations: int = DEFAULT_MAX_SYNC_CONVERSATIONS,
    cache: bool | None = None,
    allowed_hosts: Iterable[str] = (),
    cors_origins: Iterable[str] = (),
    body_timeout_s: float | None = DEFAULT_BODY_TIMEOUT,
    webhook_url: str | None = None,
    webhook_secret: str | None = None,
    database: str | None = None,
) -> FastAPI:
    """The OpenAI Files + Batches API, ``/v1/models``, one-request passthrough, the original
    protocol's ``/batch-inference`` routes and a status page at ``/`` over ``target`` (guide:
    ``docs/server.md``). Tenants share the provider through a fair gate (``server._fair``).

    Args:
        target: a :class:`~batchclient.Provider` (the app's lifespan starts and stops it) or a
            :class:`~batchclient.BatchClient` (opened and closed by the lifespan unless it is
            open already; then it is left open).
        state_dir: where files and batches live (default: the client's, else
            ``$BATCHCLIENT_STATE_DIR`` or the user data directory). Without keys it is the one
            tenant's state directory; with keys each tenant has ``tenants/<id>/`` under it.
        api_keys: the keys clients must send (``Authorization: Bearer <key>``); each key is a
            tenant that sees only its own files and batches. Empty: no authentication, one
            tenant (bind to loopback only; ``batchclient serve`` enforces it).
        max_upload_bytes: largest file ``POST /v1/files`` accepts (413 above it).
        max_body_bytes: largest JSON body (413 above it).
        max_sync_conversations: most conversations per ``POST /batch-inference/chat-completion``
            (400 above it, pointing to the jobs routes).
        cache: answer calls and batches from the result cache and fill it (successes only);
            each tenant has its own, in its state directory. None: the given client's switch,
            else off.
        allowed_hosts: ``Host`` names answered besides the loopback ones (``localhost``,
            ``127.0.0.1``, ``::1``); others get 421 (DNS rebinding). ``".example.com"``: the
            domain and its subdomains; ``"*"``: any name (behind a proxy that checks it).
        cors_origins: web origins (``"https://app.example.com"``) whose pages may call this
            server from a browser: CORS headers for them, none for others (the default).
        body_timeout_s: a request body must bring at least 1 KiB in every ``body_timeout_s``
            seconds of waiting for it, and its client may not be silent that long, else 408.
            None: no limit.
        webhook_url: POST a signed ``batch.completed`` / ``batch.failed`` / ``batch.expired``
            / ``batch.cancelled`` event (OpenAI's shape, Standard Webhooks signature) here
            whenever a batch of any tenant ends; retried from a durable outbox, at least once.
        webhook_secret: the signing secret, ``whsec_`` and base64 (required with the URL).
        database: a ``postgresql://`` URL holding every tenant's files, batches, results,
            idempotency keys and webhook outbox (default ``$BATCHCLIENT_DATABASE_URL``, else
            SQLite files in the state directories): any number of servers on any hosts share it
            as one service (``docs/server.md``, "Many processes").

    Raises:
        ConfigurationError: a key that cannot be sent in a header, a limit below 1, or a
            ``target`` that is neither a provider nor a client, a webhook URL that is not
            http(s) or a secret that is not ``whsec_`` and base64 of 24 to 64 bytes.

    The lifespan does the work of starting: run it (uvicorn does), or when mounting in another
    app, enter ``app.router.lifespan_context(app)`` in that app's own lifespan.
    """
    for name, value in (
        ("max_upload_bytes", max_upload_bytes),
        ("max_body_bytes", max_body_bytes),
        ("max_sync_conversations", max_sync_conversations),
    ):
        if value < 1:
            raise ConfigurationError(f"{name} must be >= 1")
    if body_timeout_s is not None and not body_timeout_s > 0:
        raise ConfigurationError("body_timeout_s must be > 0 (None: no limit)")
    origins = [o.rstrip("/") for o in cors_origins]
    for origin in origins:
        if origin != "*" and "://" not in origin:
            raise ConfigurationError(f"CORS origin {origin!r} must be scheme://host[:port]")
    if (webhook_url is None) != (webhook_secret is None):
        raise ConfigurationError("a webhook URL and its secret go together")
    webhook = None
    if webhook_url is not None and webhook_secret is not None:
        webhook = Webhook.parse(webhook_url, webhook_secret)
    metrics = Metrics()
    if isinstance(target, Provider):  # every request it runs counted (a client runs its own)
        target = MeteredProvider(target, metrics)
    tenants = Tenants(
        target, state_dir=state_dir, api_keys=tuple(api_keys), cache=cache, database=database
    )
    metrics.tenants = tenants

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.phase = STARTING
        state_dirs = [tenant.client.state_dir for tenant in tenants.tenants]
        async with delivering(webhook, state_dirs), tenants:  # events of resumed batches too
            app.state.started_at = int(time.time())
            for tenant in tenants.tenants:
                logger.info("tenant %s: state in %s", tenant.id, tenant.client.state_dir)
            probe = None
            if tenants.database is not None:  # /ready asks it, on a connection of its own
                probe = await anyio.to_thread.run_sync(Database, tenants.state_dir / DB_NAME)
                app.state.database_check = partial(anyio.to_thread.run_sync, probe.ping)
            app.state.phase = READY  # provider started, interrupted batches taken back up
            try:
                yield
            finally:
                app.state.phase = STOPPING
                if probe is not None:
                    probe.close()
        logger.info("stopped: running batches paused, they resume on the next start")

    app = FastAPI(
        title="batchclient",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.tenants = tenants
    app.state.metrics = metrics
    app.state.phase = STARTING
    app.state.started_at = int(time.time())
    app.state.max_upload_bytes = max_upload_bytes
    app.state.max_body_bytes = max_body_bytes
    app.state.max_sync_conversations = max_sync_conversations
    install_handlers(app)
    for router in (files_router, batches_router, inference_router, original_router):
        app.include_router(router)
    app.add_middleware(Interrupted)  # innermost: the access log sees its 503
    app.add_middleware(Authenticate, tenants=tenants)
    if origins:  # outside Authenticate: preflight requests carry no key
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key"],
            max_age=600,
        )
    # `/`: signs in with a cookie of its own; inside Guard (the Host allow-list covers it)
    app.add_middleware(StatusPage, tenants=tenants)
    app.add_middleware(
        Guard, allowed_hosts=allowed_hosts, cors_origins=origins, body_timeout_s=body_timeout_s
    )
    app.add_middleware(AccessLog)  # 401s and 421s are logged too
    app.add_middleware(Probes, state=app.state)  # probes unlogged, without a key
    app.add_middleware(HTTPMetrics, metrics=metrics)  # outermost: every answer counted

    @app.get("/metrics", include_in_schema=False)
    async def prometheus(request: Request) -> Response:
        """The Prometheus series (``docs/server.md``, Operations); behind the keys."""
        return await metrics.response(request)

    return app
