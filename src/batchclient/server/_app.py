"""``create_app``: the FastAPI application of ``batchclient serve``, for uvicorn or for mounting
in another ASGI application."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI

from .._core.client import BatchClient
from .._core.provider import Provider
from ..errors import ConfigurationError
from ._errors import install_handlers
from ._middleware import AccessLog, Authenticate
from ._routes_batches import router as batches_router
from ._routes_files import router as files_router
from ._routes_inference import router as inference_router
from ._routes_original import router as original_router
from ._tenants import Tenants

logger = logging.getLogger("batchclient.server")

DEFAULT_MAX_UPLOAD_BYTES = 200 * 1024 * 1024
"""Largest accepted upload: 200 MiB (OpenAI's limit for a batch input file is 200 MB)."""
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
"""Largest JSON request body: 32 MiB (the longest batch line the validator accepts)."""
DEFAULT_MAX_SYNC_CONVERSATIONS = 1000
"""Most conversations in one ``POST /batch-inference/chat-completion``."""


def create_app(
    target: Provider | BatchClient,
    *,
    state_dir: str | os.PathLike[str] | None = None,
    api_keys: Sequence[str] = (),
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_sync_conversations: int = DEFAULT_MAX_SYNC_CONVERSATIONS,
) -> FastAPI:
    """The OpenAI Files + Batches API, ``/v1/models``, one-request passthrough and the original
    protocol's ``/batch-inference`` routes over ``target`` (guide: ``docs/server.md``).

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

    Raises:
        ConfigurationError: a key that cannot be sent in a header, a limit below 1, or a
            ``target`` that is neither a provider nor a client.

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
    tenants = Tenants(target, state_dir=state_dir, api_keys=tuple(api_keys))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with tenants:
            app.state.started_at = int(time.time())
            for tenant in tenants.tenants:
                logger.info("tenant %s: state in %s", tenant.id, tenant.client.state_dir)
            yield
        logger.info("stopped: running batches paused, they resume on the next start")

    app = FastAPI(
        title="batchclient",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.tenants = tenants
    app.state.started_at = int(time.time())
    app.state.max_upload_bytes = max_upload_bytes
    app.state.max_body_bytes = max_body_bytes
    app.state.max_sync_conversations = max_sync_conversations
    install_handlers(app)
    for router in (files_router, batches_router, inference_router, original_router):
        app.include_router(router)
    app.add_middleware(Authenticate, tenants=tenants)
    app.add_middleware(AccessLog)  # outermost: 401s are logged too
    return app
