"""A real PostgreSQL server on loopback for tests, demos and benchmarks: the distribution's
``initdb`` and ``pg_ctl`` in a temporary folder, trust authentication on 127.0.0.1 only, made
for speed over durability (``fsync=off``), removed on :meth:`PostgresServer.stop`. Run as the
``postgres`` user (else ``nobody``) when the caller is root: ``initdb`` refuses root."""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

from ._vllm_server import free_port


def postgres_binary(name: str) -> str | None:
    """The path of a PostgreSQL server program (``initdb``, ``pg_ctl``): on ``PATH``, else in
    the newest ``/usr/lib/postgresql/<version>/bin`` (Debian's place); None without one."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return versions[-1] if versions else None


class PostgresServer:
    """A PostgreSQL server started on a free loopback port (about 3 s). Use as a context
    manager, or call :meth:`stop`. :attr:`url` is its ``postgres`` database;
    :meth:`database` makes a new empty one.

    Raises:
        RuntimeError: the server programs are missing (``apt-get install postgresql``).
        subprocess.CalledProcessError: ``initdb`` or ``pg_ctl`` failed.
    """

    def __init__(self) -> None:
        initdb, pg_ctl = postgres_binary("initdb"), postgres_binary("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise RuntimeError("no PostgreSQL server programs (apt-get install postgresql)")
        self._pg_ctl = pg_ctl
        self.root = Path(tempfile.mkdtemp(prefix="batchclient-pg-"))
        self.port = free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = "postgres" if _has_user("postgres") else "nobody"
            shutil.chown(self.root, user)
            self._as = ["runuser", "-u", user, "--"]
        data = str(self.root / "data")
        try:
            self._run(initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8")
            options = (
                f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                "-c fsync=off -c max_connections=200"
            )
            log = str(self.root / "log")
            self._run(pg_ctl, "-D", data, "-l", log, "-w", "-o", options, "start")
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, cwd=self.root)

    def database(self) -> str:
        """The URL of a new, empty database (needs ``psycopg``)."""
        import psycopg

        name = f"db_{secrets.token_hex(6)}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        """Stop the server at once and remove its folder."""
        subprocess.run(
            [*self._as, self._pg_ctl, "-D", str(self.root / "data"), "-m", "immediate", "stop"],
            capture_output=True,
            cwd=self.root,
        )
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
