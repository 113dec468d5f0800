"""``batchclient serve`` as a library: a durable OpenAI Files + Batches API, ``/v1/models``,
one-request passthrough and the original protocol's ``/batch-inference`` routes, in front of
any provider (guide: ``docs/server.md``).

- :func:`create_app`: the FastAPI application over a provider or a client;
- :func:`is_loopback`: whether a host to bind is reachable only from this machine;
- :func:`tenant_id`: the state subdirectory name of an API key (never the key itself).

Needs the ``server`` extra: ``pip install 'batchclient[server]'`` (FastAPI, uvicorn,
python-multipart).
"""

try:
    import fastapi  # noqa: F401
    import python_multipart  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        f"batchclient.server needs the server extra: pip install 'batchclient[server]' ({exc})"
    ) from exc

from ._app import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_SYNC_CONVERSATIONS,
    DEFAULT_MAX_UPLOAD_BYTES,
    create_app,
)
from ._bind import is_loopback
from ._tenants import tenant_id

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_SYNC_CONVERSATIONS",
    "DEFAULT_MAX_UPLOAD_BYTES",
    "create_app",
    "is_loopback",
    "tenant_id",
]
