"""``batchclient serve``: the OpenAI Files + Batches API (and the original ``/batch-inference``
routes) over HTTP, in front of a provider, on uvicorn (guide: ``docs/server.md``).

Start-up: the provider is started and every tenant's unfinished batches resume before the port
opens. SIGTERM or Ctrl-C: the port stops accepting, open requests get up to
:data:`GRACE_S` seconds, then running batches are paused (they resume on the next start on the
same state directory) and the provider stops.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from types import FrameType

import anyio

from ..errors import ConfigurationError
from ._run import add_provider_arguments, make_provider

GRACE_S = 5
"""Seconds open requests get after SIGTERM before they are cancelled."""
KEYS_ENV = "BATCHCLIENT_API_KEYS"


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    add_provider_arguments(p, api_key_flag="--upstream-api-key")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument(
        "--api-key",
        dest="api_keys",
        action="append",
        default=None,
        metavar="KEY",
        help=f"a key clients must send (Authorization: Bearer KEY); repeatable, each key is a "
        f"tenant with its own files and batches (default: ${KEYS_ENV}, comma-separated)",
    )
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow listening on a non-loopback address without keys (anyone who reaches it "
        "can use the provider and read every batch)",
    )
    p.add_argument(
        "--max-upload-mib",
        type=float,
        default=200.0,
        help="largest file POST /v1/files accepts, MiB (default 200)",
    )
    p.add_argument(
        "--max-sync-conversations",
        type=int,
        default=1000,
        help="most conversations per POST /batch-inference/chat-completion (default 1000)",
    )
    p.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--ssl-keyfile", default=None, help="the certificate's private key (PEM)")
    p.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log level (default info: one line per request)",
    )


def api_keys(args: argparse.Namespace) -> list[str]:
    """``--api-key`` values, else ``$BATCHCLIENT_API_KEYS`` (comma-separated)."""
    if args.api_keys:
        return list(args.api_keys)
    return [k.strip() for k in os.environ.get(KEYS_ENV, "").split(",") if k.strip()]


def serve_command(args: argparse.Namespace) -> int:
    try:
        from ..server import create_app, is_loopback
    except ImportError as exc:
        raise ConfigurationError(str(exc)) from None
    keys = api_keys(args)
    if not keys and not args.insecure_no_auth and not is_loopback(args.host):
        raise ConfigurationError(
            f"refusing to listen on {args.host} without keys: anyone who can reach it could use "
            f"the provider and read every batch. Give --api-key (or ${KEYS_ENV}), or "
            "--insecure-no-auth to accept that"
        )
    if (args.ssl_certfile is None) != (args.ssl_keyfile is None):
        raise ConfigurationError("--ssl-certfile and --ssl-keyfile go together")
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    provider = make_provider(args)
    app = create_app(
        provider,
        state_dir=getattr(args, "state_dir", None),
        api_keys=keys,
        max_upload_bytes=int(args.max_upload_mib * 1024 * 1024),
        max_sync_conversations=args.max_sync_conversations,
    )
    logging.getLogger("batchclient.server").info(
        "provider %s; %d key(s)", json.dumps(provider.identity(), sort_keys=True), len(keys)
    )
    received: list[int] = []

    def remember(sig: int, frame: FrameType | None) -> None:
        received.append(sig)  # uvicorn re-raises the signal it handled once it has stopped

    previous = {s: signal.signal(s, remember) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        anyio.run(_serve, app, args, received)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 130 if signal.SIGINT in received else 0


async def _serve(app: object, args: argparse.Namespace, received: list[int]) -> None:
    import uvicorn
    from fastapi import FastAPI

    assert isinstance(app, FastAPI)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        lifespan="off",  # entered here, so a failed start is an error message, not a traceback
        log_config=None,
        access_log=False,  # batchclient.server logs one line per request, without the query
        timeout_graceful_shutdown=GRACE_S,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
    )
    async with app.router.lifespan_context(app):
        if not received:  # a signal during start-up: stop without serving
            await uvicorn.Server(config).serve()
