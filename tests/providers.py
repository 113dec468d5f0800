"""The two providers as the provider-parametrized suites see them (``test_contract.py``,
``test_structured.py``; the ``provider`` fixture is in ``conftest.py``), and prompt-length
helpers: the bundled model's own tokenizer and chat template count prompt tokens exactly as the
server and the engine do."""

from __future__ import annotations

import contextlib
import re
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import anyio

from batchclient import BatchClient, RemoteBatchInference, SamplingParams
from batchclient.models import bundled_model_path

MODEL = "smollm2"


@cache
def tokenizer() -> Any:
    """The bundled model's Hugging Face tokenizer, as ``AutoTokenizer`` loads it: its
    ``tokenizer_config.json`` names the generic fast class, which is loaded here directly
    (``test_models.py`` checks that the two agree). ``AutoTokenizer`` would import transformers'
    model registry, and torch and scikit-learn with it: 7 s of CPU in each test process."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(bundled_model_path(), local_files_only=True)


def prompt_tokens(conversation: Sequence[dict[str, Any]]) -> int:
    """Tokens of a conversation as the server and engine count them (chat template applied)."""
    text = tokenizer().apply_chat_template(
        list(conversation), add_generation_prompt=True, tokenize=False
    )
    return len(tokenizer()(text, add_special_tokens=False)["input_ids"])


def _server_running_requests(base_url: str) -> float:
    """The server's own count of running + waiting requests (Prometheus ``/metrics``)."""
    root = base_url.removesuffix("/v1")
    text = urllib.request.urlopen(f"{root}/metrics", timeout=10).read().decode()
    total = 0.0
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        for match in re.finditer(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M):
            total += float(match.group(1))
    return total


@dataclass
class Provider:
    name: str
    open: Callable[[], contextlib.AbstractAsyncContextManager[BatchClient]]
    assert_idle: Callable[[BatchClient], Any]  # async: the engine's own counts say idle


def remote_provider(base_url: str) -> Provider:
    @contextlib.asynccontextmanager
    async def open_client() -> AsyncIterator[BatchClient]:
        async with RemoteBatchInference(base_url, max_concurrency=64) as client:
            yield client

    async def assert_idle(_client: BatchClient) -> None:
        # The server aborts a request when its client disconnects. vLLM (0.32) misses the abort
        # of a request whose connection closed while it was still being prepared; such a
        # straggler runs to its max_tokens. Raw aiohttp clients cancelled the same way left 4 of
        # 48 running; so nearly all must be gone, and the rest are waited for (not asserted) so
        # that later tests find the server idle.
        deadline = time.monotonic() + 10
        while _server_running_requests(base_url) > 6 and time.monotonic() < deadline:
            await anyio.sleep(0.25)
        assert _server_running_requests(base_url) <= 6
        deadline = time.monotonic() + 120
        while _server_running_requests(base_url) > 0 and time.monotonic() < deadline:
            await anyio.sleep(0.5)

    return Provider("remote", open_client, assert_idle)


def inline_provider(client: Any) -> Provider:
    @contextlib.asynccontextmanager
    async def open_client() -> AsyncIterator[BatchClient]:
        yield client  # the session's engine: never closed here

    async def assert_idle(_client: BatchClient) -> None:
        # The engine core reports its scheduler's counts with each step's output, so run one
        # tiny request: when it comes back the last report is fresh. Requests that were not
        # aborted would still be running (they asked for 1,500 tokens).
        hi = [{"role": "user", "content": "Hi"}]
        probe = await client.batch_chat_completion(
            MODEL, [hi], sampling_params=SamplingParams(max_tokens=2)
        )
        assert probe.batch[0].error is None
        assert client.provider.engine_counts() == (
            0,
            0,
            0,
        )  # (front end unfinished, running, waiting)

    return Provider("inline", open_client, assert_idle)
