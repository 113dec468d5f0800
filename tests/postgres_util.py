"""The PostgreSQL server of the tests that need one (:class:`batchclient.testing.PostgresServer`,
one per pytest process, stopped at the end of the session) and a new empty database per test.
Without the server programs (``apt-get install postgresql``; ``make setup`` installs them as
root) those tests skip, saying so."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from batchclient.testing import PostgresServer
from batchclient.testing._postgres import postgres_binary


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    if postgres_binary("initdb") is None:
        pytest.skip("no PostgreSQL server programs (apt-get install postgresql)")
    with PostgresServer() as server:
        yield server


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> str:
    """A new, empty PostgreSQL database for this test (its URL)."""
    return postgres_server.database()
