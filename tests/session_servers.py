"""The session's real vLLM servers, started once by the pytest process that runs the session
(``pytest --shared-vllm-servers``, as ``make test`` runs it) and shared by all its pytest-xdist
workers.

Without it, each worker whose tests use a server starts its own: under ``--dist loadgroup``
that is two chat servers (the server group's and the engine group's, whose tests compare the
in-process engine with the server) and a pooling server in whichever worker runs the
embedding tests, one after another in that worker. With it, the main process starts every
server once, in the background, before the workers collect, and stops each as soon as every
test that may use it has finished (a vLLM server holds gigabytes that the engines and Ray
replicas started later need on a small machine). A worker's fixture waits until its server
answers, or reads why it could not start.

The shared folder (``$BATCHCLIENT_TEST_SHARED_SERVERS``, inherited by the workers) holds, per
server ``NAME``: ``NAME.url`` once it answers, ``NAME.error`` when it could not start,
``NAME.stopped`` once stopped (a fixture that still asks for it then starts one of its own);
and ``users.json``, ``{NAME: [node ids of the tests that may use it]}``, written by the first
worker to finish collecting.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from batchclient.testing import vllm_server

SHARED_ENV = "BATCHCLIENT_TEST_SHARED_SERVERS"
START_TIMEOUT_S = 900.0
"""How long a shared server may take to start: they start while every worker collects and the
engines start beside them, on 2 cores."""


class SessionServers:
    """Servers started in background threads of this process; each stops once its tests
    have finished (:meth:`pytest_runtest_logreport`: registered as a plugin), and
    :meth:`stop` stops what is left."""

    def __init__(self, specs: Mapping[str, Mapping[str, Any]]) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="batchclient-servers-"))
        self._stops = {name: threading.Event() for name in specs}
        self._threads = [
            threading.Thread(target=self._serve, args=(name, dict(spec)), daemon=True)
            for name, spec in specs.items()
        ]
        self._pending: dict[str, set[str]] | None = None  # read from users.json
        self._finished: set[str] = set()

    def start(self) -> None:
        os.environ[SHARED_ENV] = str(self.folder)
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        for event in self._stops.values():
            event.set()
        for thread in self._threads:
            thread.join(timeout=60)
        shutil.rmtree(self.folder, ignore_errors=True)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """After each test's teardown: stop the servers no test left to run may use."""
        if report.when != "teardown":
            return
        self._finished.add(report.nodeid)
        if self._pending is None:
            users = self.folder / "users.json"
            if not users.exists():
                return  # no worker has finished collecting: nothing is known yet
            known = json.loads(users.read_text(encoding="utf-8"))
            self._pending = {name: set(ids) for name, ids in known.items()}
        for name, pending in self._pending.items():
            pending -= self._finished
            if not pending and name in self._stops and not self._stops[name].is_set():
                self._stops[name].set()  # its thread stops it, without holding this hook

    def _serve(self, name: str, spec: dict[str, Any]) -> None:
        try:
            with vllm_server(startup_timeout_s=START_TIMEOUT_S, **spec) as url:
                _publish(self.folder / f"{name}.url", url)
                self._stops[name].wait()
                _publish(self.folder / f"{name}.stopped", "")  # before it goes: none is sent
        except Exception as exc:  # the worker that needs it reports it
            _publish(self.folder / f"{name}.error", f"{type(exc).__name__}: {exc}")


def _publish(path: Path, text: str) -> None:
    """Write ``path`` whole: a worker that sees the name reads everything."""
    part = path.with_name(path.name + ".part")
    part.write_text(text, encoding="utf-8")
    part.replace(path)


def publish_users(users: Mapping[str, Iterable[str]]) -> None:
    """Tell the main process which tests may use each shared server (once per session: the
    first worker to finish collecting writes it; the others collected the same)."""
    folder = os.environ.get(SHARED_ENV)
    if folder and not Path(folder, "users.json").exists():
        _publish(Path(folder, "users.json"), json.dumps({k: sorted(v) for k, v in users.items()}))


def shared_url(name: str) -> str | None:
    """The base URL of the session's shared server ``name`` once it answers; None when this
    session shares no servers, or stopped it (no test was to use it again).

    Raises:
        RuntimeError: the server could not start (the message has its log's tail), or did not
            answer within :data:`START_TIMEOUT_S` plus a minute.
    """
    folder = os.environ.get(SHARED_ENV)
    if not folder or Path(folder, f"{name}.stopped").exists():
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
