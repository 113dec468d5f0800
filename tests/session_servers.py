"""The session's real vLLM servers, started once by the pytest process that runs the session
(``pytest --shared-vllm-servers``, as ``make test`` runs it) and shared by all its pytest-xdist
workers.

Without it, each worker whose tests use a server starts its own: under ``--dist loadgroup``
that is two chat servers (the server group's and the engine group's, whose tests compare the
in-process engine with the server) and a pooling server in whichever worker runs the
embedding tests, one after another in that worker. With it, the main process starts every
server once, in the background, before the workers collect, and stops them when the session
ends. A worker's fixture waits until its server answers, or reads why it could not start.

Each server is started in a thread of the main process (:func:`vllm_server` blocks until the
server answers); it leaves a file in the shared folder (``$BATCHCLIENT_TEST_SHARED_SERVERS``,
inherited by the workers): ``NAME.url`` once the server answers, ``NAME.error`` when it could
not start.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from batchclient.testing import vllm_server

SHARED_ENV = "BATCHCLIENT_TEST_SHARED_SERVERS"
START_TIMEOUT_S = 900.0
"""How long a shared server may take to start: they start while every worker collects and the
engines start beside them, on 2 cores."""


class SessionServers:
    """Servers started in background threads of this process; :meth:`stop` stops them all."""

    def __init__(self, specs: Mapping[str, Mapping[str, Any]]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="batchclient-servers-"))
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._serve, args=(name, dict(spec)), daemon=True)
            for name, spec in specs.items()
        ]

    def start(self) -> None:
        os.environ[SHARED_ENV] = str(self.folder)
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _serve(self, name: str, spec: dict[str, Any]) -> None:
        try:
            with vllm_server(startup_timeout_s=START_TIMEOUT_S, **spec) as url:
                _publish(self.folder / f"{name}.url", url)
                self._stop.wait()
        except Exception as exc:  # the worker that needs it reports it
            _publish(self.folder / f"{name}.error", f"{type(exc).__name__}: {exc}")


def _publish(path: Path, text: str) -> None:
    """Write ``path`` whole: a worker that sees the name reads everything."""
    part = path.with_suffix(".part")
    part.write_text(text, encoding="utf-8")
    part.replace(path)


def shared_url(name: str) -> str | None:
    """The base URL of the session's shared server ``name`` once it answers; None when this
    session shares no servers.

    Raises:
        RuntimeError: the server could not start (the message has its log's tail), or did not
            answer within :data:`START_TIMEOUT_S` plus a minute.
    """
    folder = os.environ.get(SHARED_ENV)
    if not folder:
        return None
    url, error = Path(folder, f"{name}.url"), Path(folder, f"{name}.error")
    deadline = time.monotonic() + START_TIMEOUT_S + 60
    while time.monotonic() < deadline:
        if url.exists():
            return url.read_text(encoding="utf-8")
        if error.exists():
            raise RuntimeError(f"the session's {name} server: {error.read_text('utf-8')}")
        time.sleep(0.5)
    raise RuntimeError(f"the session's {name} server did not start in {START_TIMEOUT_S:g} s")
