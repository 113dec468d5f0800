"""Shared fixtures: the real vLLM OpenAI server, started once per test session.

Set ``BATCHCLIENT_TEST_BASE_URL`` (e.g. ``http://127.0.0.1:8000/v1``) to run the server tests
against a server that is already running (it must serve the bundled model as ``smollm2`` with
``--max-model-len 2048``) instead of starting one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from batchclient.testing import vllm_server


@pytest.fixture(scope="session")
def vllm_url() -> Iterator[str]:
    """Base URL (ending in ``/v1``) of a real vLLM server with the bundled model as ``smollm2``,
    ``max_model_len`` 2048."""
    given = os.environ.get("BATCHCLIENT_TEST_BASE_URL")
    if given:
        yield given.rstrip("/")
        return
    with vllm_server(max_model_len=2048) as url:
        yield url
