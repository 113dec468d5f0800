"""A counting reverse proxy on loopback (re-exported by ``testing``): forwards
``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and ``/v1/models`` to a real
server and counts every request it forwards (``/v1/models`` aside), keyed by its body, so
tests and benchmarks can tell how many requests were sent twice (e.g. after a kill-and-resume).
A client that hangs up has its upstream request closed too, so the real server aborts it.

Runs in a background thread (``with CountingProxy(url) as proxy: proxy.url``).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import aiohttp
from aiohttp import web

from ..types import Endpoint

__all__ = ["CountingProxy"]


class CountingProxy:
    """Forward to ``upstream`` (a base URL ending in ``/v1``); ``url`` is the proxy's own.

    ``bodies`` counts forwarded requests by raw body; ``resent`` is how many were sent
    more than once; ``in_flight`` how many are open right now."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.bodies: Counter[bytes] = Counter()
        self.in_flight = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> int:
        return sum(self.bodies.values())

    @property
    def resent(self) -> int:
        return sum(n - 1 for n in self.bodies.values() if n > 1)

    async def _forward(self, request: web.Request) -> web.Response:
        path = request.path.removeprefix("/v1")
        raw = await request.read()
        self.bodies[raw] += 1
        self.in_flight += 1
        try:
            assert self._session is not None
            async with self._session.post(
                f"{self.upstream}{path}",
                data=raw,
                headers={"Content-Type": "application/json"},
            ) as resp:
                body = await resp.read()
                return web.Response(status=resp.status, body=body, content_type="application/json")
        finally:
            self.in_flight -= 1

    async def _models(self, request: web.Request) -> web.Response:
        assert self._session is not None
        async with self._session.get(f"{self.upstream}/models") as resp:
            return web.Response(
                status=resp.status, body=await resp.read(), content_type="application/json"
            )

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for endpoint in Endpoint:
            app.router.add_post(endpoint.value, self._forward)
        app.router.add_get("/v1/models", self._models)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, handler_cancellation=True
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        sockets = getattr(site._server, "sockets", None)
        assert sockets
        self.port = int(sockets[0].getsockname()[1])
        self._ready.set()
        await self._stopped.wait()
        await runner.cleanup()
        await self._session.close()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        loop.run_until_complete(self._serve())
        loop.close()

    def start(self) -> CountingProxy:
        self._thread = threading.Thread(target=self._run, name="counting-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("proxy did not start within 10 s")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(15)
            self._thread = None

    def __enter__(self) -> CountingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
