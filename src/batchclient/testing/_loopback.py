"""An aiohttp application served on 127.0.0.1 from a thread of its own: the lifecycle the
Batch API stubs share (``start`` / ``stop``, ``with``), so a test drives them from any event
loop, or none."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Self

from aiohttp import web


class LoopbackApp:
    """Subclasses build the application in :meth:`_app` and may clean up in :meth:`_cleanup`
    (after the server stopped). ``port`` 0 picks a free port; it holds the bound one once
    started."""

    _name = "loopback app"

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def _app(self) -> web.Application:
        raise NotImplementedError

    def _cleanup(self) -> None:
        """Called by :meth:`stop` once the server has stopped."""

    async def _hold(self, seconds: float) -> None:
        """Wait ``seconds`` before answering, or until the app stops (a held answer never
        holds up :meth:`stop`)."""
        assert self._stopped is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"{self._name} did not start within 10 s")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        loop.run_until_complete(self._serve())
        loop.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        runner = web.AppRunner(self._app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self._ready.set()
        try:
            await self._stopped.wait()
        finally:
            for task in list(self._tasks):
                task.cancel()
            await runner.cleanup()

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(10)
        self._cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
