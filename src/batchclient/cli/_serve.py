"""``batchclient serve``: the OpenAI Files + Batches API (and the original ``/batch-inference``
routes) over HTTP, in front of a provider, on uvicorn (guide: ``docs/server.md``).

Start-up: the port opens at once; ``GET /health`` answers 200 from then on, ``GET /ready`` and
every API route 503 until the provider has started and every tenant's unfinished batches have
resumed (then ``/ready`` answers 200). SIGTERM or Ctrl-C: the port stops accepting, open
requests get up to :data:`GRACE_S` seconds, then running batches are paused (they resume on the
next start on the same state directory) and the provider stops.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from types import FrameType
from typing import Any

import anyio

from ..errors import ConfigurationError
from ._providers import add_provider_arguments, make_provider

# the server's limits, without importing the server extra (FastAPI) for --help
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0
DEFAULT_KEEP_ALIVE = 5.0
DEFAULT_MAX_CONNECTIONS = 1000
WILDCARDS = ("0.0.0.0", "::", "")

GRACE_S = 5
"""Seconds open requests get after SIGTERM before they are cancelled."""
KEYS_ENV = "BATCHCLIENT_API_KEYS"
WEBHOOK_SECRET_ENV = "BATCHCLIENT_WEBHOOK_SECRET"


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
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="also serve GET /metrics on 127.0.0.1:PORT without keys (it is served on the main "
        "port too, behind the keys); the same Host names and connection limits apply",
    )
    p.add_argument(
        "--allowed-host",
        dest="allowed_hosts",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name to answer besides localhost, 127.0.0.1, ::1 and the --host address "
        "(others get 421); repeatable; .example.com: the domain and its subdomains; *: any",
    )
    p.add_argument(
        "--cors-origin",
        dest="cors_origins",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web origin (https://app.example.com) whose pages may call this server from a "
        "browser; repeatable (default: none, no CORS headers)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULT_HEADER_TIMEOUT,
        metavar="S",
        help=f"seconds a connection has to send each request head, else it is closed "
        f"(default {DEFAULT_HEADER_TIMEOUT:g})",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_TIMEOUT,
        metavar="S",
        help=f"a request body must bring 1 KiB in every S seconds of waiting, with no silence "
        f"of S seconds, else 408 (default {DEFAULT_BODY_TIMEOUT:g})",
    )
    p.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=DEFAULT_KEEP_ALIVE,
        metavar="S",
        help=f"seconds an idle kept-alive connection stays open (default {DEFAULT_KEEP_ALIVE:g})",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help=f"connections open at once; more are closed as they arrive "
        f"(default {DEFAULT_MAX_CONNECTIONS}; keep ulimit -n above it)",
    )
    p.add_argument(
        "--webhook-url",
        default=None,
        metavar="URL",
        help="POST a signed batch.completed/failed/expired/cancelled event (OpenAI's shape, "
        "Standard Webhooks signature) to URL whenever a batch ends; retried, at least once",
    )
    p.add_argument(
        "--webhook-secret",
        default=None,
        metavar="whsec_...",
        help=f"the webhooks' signing secret (default ${WEBHOOK_SECRET_ENV}, which keeps it out "
        "of the process list)",
    )
    p.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--ssl-keyfile", default=None, help="the certificate's private key (PEM)")
    p.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log level (default info: one line per request)",
    )


FILES_KEPT = 128 + 100
"""File descriptors kept for the server's own use (databases, upstream connections, logs) and
for connections accepted at once before they are counted (the listen backlog, 100)."""
FILES_PER_TENANT = 12
"""File descriptors one tenant may hold: its jobs database, the webhook outbox's connection to
it, its idempotency keys and result cache (SQLite in WAL mode: the database, ``-wal`` and
``-shm`` each), its owner lock (6 measured with a webhook, before the last two are opened)."""


def _raise_file_limit() -> int | None:
    """Raise this process's open-files limit (``ulimit -n``) to its hard limit, as far as the
    system lets it; the limit now, or None where there is none (or no such thing)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # not POSIX
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _within_file_limit(wanted: int, tenants: int) -> int:
    """``wanted`` connections, lowered to fit the open-files limit (raised to its hard limit
    first) beside ``tenants`` tenants' files: past it, every accept fails and asyncio logs a
    traceback for each (hundreds of MB a minute), and nothing is answered.

    Raises:
        ConfigurationError: the tenants' files alone would not fit.
    """
    limit = _raise_file_limit()
    if limit is None:
        return wanted
    reserved = FILES_KEPT + FILES_PER_TENANT * tenants
    if reserved >= limit:
        raise ConfigurationError(
            f"{tenants} key(s) need about {reserved} open files and the limit (ulimit -n) is "
            f"{limit}: raise the limit, or serve fewer keys per server"
        )
    return max(1, min(wanted, limit - reserved))


def api_keys(args: argparse.Namespace) -> list[str]:
    """``--api-key`` values, else ``$BATCHCLIENT_API_KEYS`` (comma-separated)."""
    if args.api_keys:
        return list(args.api_keys)
    return [k.strip() for k in os.environ.get(KEYS_ENV, "").split(",") if k.strip()]


def webhook_secret(args: argparse.Namespace) -> str | None:
    """``--webhook-secret``, else ``$BATCHCLIENT_WEBHOOK_SECRET`` when a URL is given."""
    if args.webhook_secret is None and args.webhook_url is not None:
        return os.environ.get(WEBHOOK_SECRET_ENV) or None
    return str(args.webhook_secret) if args.webhook_secret is not None else None


def serve_command(args: argparse.Namespace) -> int:
    try:
        from ..server import create_app
        from ..server._bind import is_loopback
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
    for flag, value in (
        ("--header-timeout", args.header_timeout),
        ("--body-timeout", args.body_timeout),
        ("--keep-alive-timeout", args.keep_alive_timeout),
        ("--max-connections", args.max_connections),
    ):
        if not value > 0:
            raise ConfigurationError(f"{flag} must be > 0")
    max_connections = _within_file_limit(args.max_connections, max(1, len(keys)))
    hosts = list(args.allowed_hosts)
    if args.host not in WILDCARDS:
        hosts.append(args.host)
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
        cache=args.cache,
        allowed_hosts=hosts,
        cors_origins=args.cors_origins,
        body_timeout_s=args.body_timeout,
        webhook_url=args.webhook_url,
        webhook_secret=webhook_secret(args),
    )
    log = logging.getLogger("batchclient.server")
    log.info("provider %s; %d key(s)", json.dumps(provider.identity(), sort_keys=True), len(keys))
    if max_connections < args.max_connections:
        log.warning(
            "--max-connections %d lowered to %d: the open-files limit (ulimit -n) is %d and the "
            "server and its %d tenant(s) need files of their own; raise the limit to allow more",
            args.max_connections, max_connections,
            max_connections + FILES_KEPT + FILES_PER_TENANT * max(1, len(keys)), max(1, len(keys)),
        )  # fmt: skip
    args.max_connections = max_connections
    if args.host in WILDCARDS and not args.allowed_hosts:
        log.warning(
            "listening on %s but answering only Host names localhost, 127.0.0.1 and ::1: "
            "give --allowed-host NAME for each name clients use to reach this machine",
            args.host or "every address",
        )
    received: list[int] = []

    def remember(sig: int, frame: FrameType | None) -> None:
        received.append(sig)  # uvicorn re-raises the signal it handled once it has stopped

    previous = {s: signal.signal(s, remember) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        anyio.run(_serve, app, args, received, hosts)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 130 if signal.SIGINT in received else 0


async def _serve(
    app: object, args: argparse.Namespace, received: list[int], hosts: list[str]
) -> None:
    import uvicorn
    from fastapi import FastAPI

    from ..server import http_protocol, metrics_app, serve_starting, uvicorn_options

    assert isinstance(app, FastAPI)
    limits = uvicorn_options(
        header_timeout_s=args.header_timeout,
        keep_alive_s=args.keep_alive_timeout,
        max_connections=args.max_connections,
    )
    # requests the parser refuses (an over-long URL) answered in OpenAI's envelope
    limits["http"] = http_protocol(limits["http"])
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
        **limits,
    )
    others = []
    if args.metrics_port is not None:

        class Quiet(uvicorn.Server):  # the main server handles the signals, and stops this one
            def capture_signals(self) -> Any:
                return contextlib.nullcontext()

        # the main port's Host list and connection limits: no key here, but no stranger either
        metrics = uvicorn.Config(
            metrics_app(app.state.metrics, allowed_hosts=hosts), host="127.0.0.1",
            port=args.metrics_port, lifespan="off", log_config=None, access_log=False, **limits,
        )  # fmt: skip
        others.append(Quiet(metrics))
    await serve_starting(app, uvicorn.Server(config), *others)
