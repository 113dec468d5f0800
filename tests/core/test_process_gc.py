"""A library leaves its process alone: a batch call never switches Python's cycle collector off
(nor freezes it), so code beside the call (lm-eval, a web app, other threads) keeps it. Sampled
while 2,000-item calls run against the stub: from ``on_item``, from a progress callback, from a
concurrent task and from a thread that polls all along (the answers are built in one go at the
end of a call without ``on_item``, with no await in between: only a thread sees that moment)."""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator

import anyio
import anyio.lowlevel
import pytest

from batchclient import BatchProgress, ChatCompletionResponse, RemoteBatchInference
from batchclient.testing import StubServer

ITEMS = 2000


class Samples:
    """``gc.isenabled()`` and ``gc.get_freeze_count()`` as seen from one place."""

    def __init__(self) -> None:
        self.taken = 0
        self.disabled = 0
        self.frozen = 0

    def take(self) -> None:
        self.taken += 1
        self.disabled += not gc.isenabled()
        self.frozen += gc.get_freeze_count() > 0


@pytest.fixture
def often() -> Iterator[None]:
    """Threads take turns every 0.1 ms (default 5 ms), so the polling thread runs many times
    during the build at the end of a call."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.0001)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.mark.slow
async def test_the_cycle_collector_stays_on_throughout_a_call(often: None) -> None:
    assert gc.isenabled() and gc.get_freeze_count() == 0
    where = {name: Samples() for name in ("on_item", "progress", "task", "thread")}
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            where["thread"].take()

    def on_item(index: int, item: ChatCompletionResponse) -> None:
        where["on_item"].take()

    def progress(report: BatchProgress) -> None:
        where["progress"].take()

    async def watch() -> None:
        while True:
            where["task"].take()
            await anyio.lowlevel.checkpoint()

    conversations = [[{"role": "user", "content": f"question {i}"}] for i in range(ITEMS)]
    poller = threading.Thread(target=poll, daemon=True)
    with StubServer() as stub:
        async with RemoteBatchInference(stub.url, max_concurrency=64) as client:
            poller.start()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(watch)
                    with_items = await client.batch_chat_completion(
                        "smollm2", conversations, on_item=on_item
                    )
                    # no on_item: answers staged while in flight, built in one go at the end
                    staged = await client.batch_chat_completion(
                        "smollm2", conversations, progress=progress
                    )
                    tg.cancel_scope.cancel()
            finally:
                done.set()
                poller.join(10)
    assert not with_items.errors and not staged.errors
    assert staged.batch[-1].text == f"echo: question {ITEMS - 1}"
    assert where["on_item"].taken == ITEMS
    assert where["progress"].taken >= 1 and where["task"].taken >= 100
    assert where["thread"].taken >= 100
    seen = {name: (s.disabled, s.frozen) for name, s in where.items()}
    assert all(counts == (0, 0) for counts in seen.values()), seen
    assert gc.isenabled() and gc.get_freeze_count() == 0
