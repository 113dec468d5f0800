"""An ASGI application served by a real uvicorn server on loopback (re-exported by
``testing``), for tests:

- ``with AppServer(app) as url:`` serves it in a background thread with its own event loop, so
  synchronous clients (``openai.OpenAI``) can call it from the test's thread;
- ``async with AppServer(app) as url:`` serves it as a task of the running event loop, for an
  app over a provider or client already open in that loop (an inline engine is bound to the
  loop it was started in).

``url`` is ``http://127.0.0.1:PORT`` (the openai SDK's ``base_url`` is ``url + "/v1"``). The
app's lifespan runs in the serving loop. Signals are left alone (uvicorn would otherwise take
over SIGINT/SIGTERM of the test process). Needs uvicorn (the ``server`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from types import TracebackType
from typing import Any

__all__ = ["AppServer"]


class AppServer:
    """Serve ``app`` on ``host`` (a free port) until the ``with`` block ends.

    Args:
        app: any ASGI application.
        host: where to listen (loopback by default).
        startup_timeout_s: seconds the app's lifespan may take to start.
        **config: more ``uvicorn.Config`` arguments (``ssl_certfile``, ``ssl_keyfile``, ...).

    Raises (on entering): ``RuntimeError`` when the app failed to start (uvicorn logs why).
    """

    def __init__(
        self, app: Any, *, host: str = "127.0.0.1", startup_timeout_s: float = 60.0, **config: Any
    ) -> None:
        self.app = app
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.config = config
        self.port = 0
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.config.get("ssl_certfile") else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def _make_server(self) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            def capture_signals(self) -> Any:
                return contextlib.nullcontext()

        config = uvicorn.Config(
            self.app, host=self.host, port=0, log_config=None, access_log=False, **self.config
        )
        self._server = Server(config)
        return self._server

    def _started(self, alive: bool, deadline: float) -> bool:
        if self._server.started:
            self.port = int(self._server.servers[0].sockets[0].getsockname()[1])
            return True
        if not alive or time.monotonic() > deadline:
            raise RuntimeError("the app did not start (see the uvicorn log)")
        return False

    # ------------------------------------------------------------------ in a thread

    def __enter__(self) -> str:
        server = self._make_server()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(server.serve()), name="app-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            while not self._started(self._thread.is_alive(), deadline):
                time.sleep(0.01)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self.url

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None

    # ------------------------------------------------------------------ in this event loop

    async def __aenter__(self) -> str:
        server = self._make_server()
        self._task = asyncio.get_running_loop().create_task(server.serve())
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            # uvicorn sets a flag when it listens; there is no event to wait on
            while not self._started(not self._task.done(), deadline):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self.url

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.should_exit = True
        task, self._task = self._task, None
        if task is not None:
            await task
