"""A real PostgreSQL server for the tests: the distribution's ``initdb`` and ``pg_ctl`` in a
temporary folder, loopback only, trust authentication, stopped at the end of the session.
Run as the ``postgres`` user when the tests run as root (``initdb`` refuses root). Without the
server binaries (``apt-get install postgresql``; ``make setup`` installs them) the tests that
need one skip, saying so."""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return versions[-1] if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One PostgreSQL server; :meth:`database` makes a new empty database on it."""

    def __init__(self) -> None:
        initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
        if initdb is None or pg_ctl is None:
            pytest.skip("no PostgreSQL server binaries (apt-get install postgresql)")
        self.pg_ctl = pg_ctl
        self.root = Path(tempfile.mkdtemp(prefix="batchclient-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = "postgres" if _has_user("postgres") else "nobody"
            shutil.chown(self.root, user)
            self._as = ["runuser", "-u", user, "--"]
        self._run(initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=200"
        )
        log = str(self.root / "log")
        self._run(pg_ctl, "-D", str(self.data), "-l", log, "-w", "-o", options, "start")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, cwd=self.root)

    def database(self) -> str:
        """The URL of a new, empty database."""
        import psycopg

        name = f"t_{secrets.token_hex(6)}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        subprocess.run(
            [*self._as, self.pg_ctl, "-D", str(self.data), "-m", "immediate", "stop"],
            capture_output=True,
            cwd=self.root,
        )
        shutil.rmtree(self.root, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> str:
    """A new, empty PostgreSQL database for this test (its URL)."""
    return postgres_server.database()
