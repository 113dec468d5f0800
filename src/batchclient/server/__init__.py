"""``batchclient serve`` as a library: a durable OpenAI Files + Batches API, ``/v1/models``,
one-request passthrough and the original protocol's ``/batch-inference`` routes, in front of
any provider (guide: ``docs/server.md``).

- :func:`create_app`: the FastAPI application over a provider or a client (with
  ``webhook_url``: a signed event whenever a batch ends, from a durable outbox);
- :func:`is_loopback`: whether a host to bind is reachable only from this machine;
- :func:`serve_starting`: serve an app on uvicorn while its lifespan starts (probes answer
  at once, ``/ready`` once started), as ``batchclient serve`` does;
- :func:`metrics_app`: an ASGI app of ``GET /metrics`` alone, for a port of its own (with the
  ``Host`` allow-list);
- :func:`http_protocol`: uvicorn's HTTP protocol answering the requests its parser refuses (an
  over-long URL) in OpenAI's envelope: ``uvicorn.Config(app, http=http_protocol())``;
- :func:`uvicorn_options`: ``uvicorn.Config`` arguments bounding connections (a header timeout,
  a connection cap, the keep-alive timeout, the request head's size);
- :func:`tenant_id`: the state subdirectory name of an API key (never the key itself).

Needs the ``server`` extra: ``pip install 'batchclient[server]'`` (FastAPI, uvicorn,
python-multipart, prometheus-client).
"""

try:
    import fastapi  # noqa: F401
    import prometheus_client  # noqa: F401
    import python_multipart  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        f"batchclient.server needs the server extra: pip install 'batchclient[server]' ({exc})"
    ) from exc

from ._app import create_app
from ._health import serve_starting
from ._interrupted import http_protocol
from ._metrics import metrics_app
from ._protocol import uvicorn_options
from ._tenants import tenant_id

__all__ = [
    "create_app",
    "http_protocol",
    "metrics_app",
    "serve_starting",
    "tenant_id",
    "uvicorn_options",
]
