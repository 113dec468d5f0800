"""Servers as their own processes: ``python -m batchclient.testing stub [options]`` (the stub)
and ``python -m batchclient.testing vllm [options]`` (the real vLLM server with the bundled
model, for trying the README's examples; :func:`.vllm_server`).

Benchmarks need the stub on another core than the client (and an endpoint they can really
kill), so the stub runs as a child process; :class:`StubProcess` starts one and stops it.
The process prints one line ``READY http://127.0.0.1:PORT/v1`` once it listens, and serves
``GET /stats`` (JSON counters: requests, max_in_flight, by_status).

Options: ``python -m batchclient.testing stub --help`` (and ``vllm --help``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from ._stub import QUOTA_STYLES, Fault, StubReply, StubServer

__all__ = ["StubProcess", "main"]


def _burst(spec: str) -> Fault:
    parts = spec.split(":")
    if len(parts) not in (3, 4):
        raise argparse.ArgumentTypeError("--burst is STATUS:START:DURATION[:RETRY_AFTER]")
    status, start, duration = int(parts[0]), float(parts[1]), float(parts[2])
    return Fault(
        StubReply(status=status, body={"error": {"message": f"burst {status}"}}),
        after_s=start,
        until_s=start + duration,
        retry_after=parts[3] if len(parts) == 4 else None,
    )


def _quota(spec: str) -> tuple[int, float]:
    limit, sep, period = spec.partition(":")
    try:
        return int(limit), float(period) if sep else 60.0
    except ValueError:
        raise argparse.ArgumentTypeError("--quota is N:PERIOD (requests per seconds)") from None


def _capacity_at(spec: str) -> tuple[float, int]:
    after, _, capacity = spec.partition(":")
    try:
        return float(after), int(capacity)
    except ValueError:
        raise argparse.ArgumentTypeError("--capacity-at is T:N (seconds:requests)") from None


_STUB_HELP = (
    "An OpenAI-compatible stub server on 127.0.0.1 that answers every chat request with "
    '"echo: <the last user message>" (model smollm2), with latency, capacity limits, quotas and '
    "faults on demand. Prints READY <base URL> once it listens; GET /stats gives its counters. "
    "Stops on Ctrl-C or SIGTERM. Times are in seconds."
)
_VLLM_HELP = (
    "The real vLLM OpenAI server on 127.0.0.1 with the bundled SmolLM2-135M-Instruct served as "
    "smollm2 (converted on first use, about 30 s; the server starts in about a minute on 2 CPU "
    "cores). Prints READY <base URL> once it answers; Ctrl-C or SIGTERM stops it and every "
    "process it started."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m batchclient.testing",
        description="Loopback servers for trying batchclient and for its tests and benchmarks.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    stub = sub.add_parser(
        "stub", help="run the fault-injecting stub server", description=_STUB_HELP
    )
    stub.add_argument(
        "--port",
        metavar="P",
        type=int,
        default=0,
        help="TCP port (default 0: any free one; READY tells)",
    )
    stub.add_argument(
        "--latency", metavar="S", type=float, default=0.0, help="seconds to answer each request"
    )
    stub.add_argument(
        "--jitter", metavar="S", type=float, default=0.0, help="+ up to this many seconds"
    )
    stub.add_argument(
        "--capacity",
        metavar="N",
        type=int,
        default=None,
        help="refuse requests arriving while N are in flight",
    )
    stub.add_argument(
        "--capacity-retry-after",
        metavar="V",
        default=None,
        help="Retry-After on those refusals: seconds, or date:S (an HTTP date S seconds ahead)",
    )
    stub.add_argument(
        "--capacity-status",
        metavar="STATUS",
        type=int,
        default=429,
        help="status above the capacity (429 or 503)",
    )
    stub.add_argument(
        "--reject-after-work",
        action="store_true",
        help="refuse above the capacity only after --latency (a backend behind a queue)",
    )
    stub.add_argument(
        "--capacity-at",
        metavar="T:N",
        type=_capacity_at,
        action="append",
        default=[],
        help="T:N: the capacity is N from T seconds after the start on (repeatable)",
    )
    stub.add_argument(
        "--burst",
        metavar="SPEC",
        type=_burst,
        action="append",
        default=[],
        help="STATUS:START:DURATION[:RETRY_AFTER]: answer STATUS to every request arriving in "
        "that window (repeatable)",
    )
    stub.add_argument(
        "--quota",
        metavar="N:PERIOD",
        type=_quota,
        default=None,
        help="N:PERIOD: at most N requests per PERIOD-second window (429 above it), announced "
        "in x-ratelimit-* headers",
    )
    stub.add_argument(
        "--token-quota",
        metavar="N:PERIOD",
        type=_quota,
        default=None,
        help="N:PERIOD: the same for tokens (prompt words + max_tokens)",
    )
    stub.add_argument(
        "--no-quota-headers", action="store_true", help="enforce the quotas without announcing them"
    )
    stub.add_argument(
        "--quota-retry-after",
        action="store_true",
        help="add Retry-After (seconds to the window's end) to the quota's 429s",
    )
    stub.add_argument(
        "--quota-style",
        metavar="STYLE",
        choices=QUOTA_STYLES,
        default="openai",
        help="how the quota is announced (default openai)",
    )
    stub.add_argument(
        "--fast",
        action="store_true",
        help="the lean asyncio responder: --latency and --capacity only (for the client-headroom "
        "benchmark)",
    )
    stub.add_argument(
        "--cpu", metavar="N", type=int, default=None, help="pin the process to CPU core N"
    )
    stub.add_argument("--uvloop", action="store_true", help="run on uvloop")
    vllm = sub.add_parser(
        "vllm", help="run the real vLLM server with the bundled model", description=_VLLM_HELP
    )
    vllm.add_argument(
        "--port", metavar="P", type=int, default=0, help="TCP port (default 0: any free one)"
    )
    vllm.add_argument(
        "--model",
        metavar="M",
        default=None,
        help="a model directory or hub id (default: the bundled model)",
    )
    vllm.add_argument(
        "--max-model-len",
        metavar="N",
        type=int,
        default=2048,
        help="context length in tokens (default 2048)",
    )
    vllm.add_argument(
        "--verbose", action="store_true", help="show the server's own output as it comes"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "vllm":
        _run_vllm(args)
        return
    # pin only to a core that exists (on a one-core machine there is nothing to pin)
    if (
        args.cpu is not None
        and hasattr(os, "sched_setaffinity")
        and args.cpu < (os.cpu_count() or 1)
    ):
        os.sched_setaffinity(0, {args.cpu})
    if args.uvloop:
        import uvloop

        uvloop.install()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    if args.fast:
        unsupported = args.reject_after_work or args.capacity_at or args.capacity_status != 429
        if args.burst or args.jitter or args.quota or args.token_quota or unsupported:
            raise SystemExit("--fast supports only --latency and --capacity")
        asyncio.run(_run_fast(args, done))
        return
    server = StubServer(
        latency_s=args.latency,
        jitter_s=args.jitter,
        capacity=args.capacity,
        capacity_retry_after=args.capacity_retry_after,
        capacity_status=args.capacity_status,
        reject_after_work=args.reject_after_work,
        capacity_schedule=list(args.capacity_at),
        faults=list(args.burst),
        quota=args.quota,
        token_quota=args.token_quota,
        quota_headers=not args.no_quota_headers,
        quota_retry_after=args.quota_retry_after,
        quota_style=args.quota_style,
        port=args.port,
    )
    with server:
        print(f"READY {server.url}", flush=True)
        done.wait()


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def _run_vllm(args: argparse.Namespace) -> None:
    """The real server until Ctrl-C or SIGTERM (both interrupt the start-up too: leaving
    ``vllm_server`` stops every process it started)."""
    from ._vllm_server import vllm_server

    signal.signal(signal.SIGTERM, _interrupt)
    print("starting the vLLM server (about a minute)...", file=sys.stderr, flush=True)
    try:
        with vllm_server(
            args.model,
            port=args.port or None,
            max_model_len=args.max_model_len,
            verbose=args.verbose,
        ) as url:
            print(f"READY {url}", flush=True)
            threading.Event().wait()
    except KeyboardInterrupt:
        pass


async def _run_fast(args: argparse.Namespace, done: threading.Event) -> None:
    from ._fast_stub import FastStub, serve_fast

    stub = FastStub(
        latency_s=args.latency,
        capacity=args.capacity,
        capacity_retry_after=args.capacity_retry_after,
    )
    server = await serve_fast(stub, "127.0.0.1", args.port)
    port = server.sockets[0].getsockname()[1]
    print(f"READY http://127.0.0.1:{port}/v1", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, done.wait)
    server.close()


class StubProcess:
    """The stub in a child process (``python -m batchclient.testing stub ...``), as a context
    manager. ``args`` are the command-line options above, e.g.
    ``StubProcess("--fast", "--cpu", "1")``. ``url`` is the base URL ending in ``/v1``;
    ``kill()`` SIGKILLs it (the kernel resets its open connections, like a crashed server);
    ``stats()`` fetches its counters; leaving the block stops it."""

    def __init__(self, *args: str, startup_timeout_s: float = 20.0) -> None:
        self.args = args
        self.startup_timeout_s = startup_timeout_s
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> StubProcess:
        cmd = [sys.executable, "-m", "batchclient.testing", "stub", *self.args]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        timer = threading.Timer(self.startup_timeout_s, self.kill)
        timer.start()
        try:
            line = self.proc.stdout.readline()
        finally:
            timer.cancel()
        if not line.startswith("READY "):
            self.kill()
            raise RuntimeError(f"stub process did not start: {line!r}")
        self.url = line.split()[1]
        return self

    def stats(self) -> dict[str, Any]:
        """The stub's counters (``GET /stats``)."""
        root = self.url.removesuffix("/v1")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{root}/stats", timeout=10) as resp:
            data: dict[str, Any] = json.loads(resp.read())
        return data

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()

    def __enter__(self) -> StubProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
