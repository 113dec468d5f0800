"""The ETA of a running batch against the truth: a steady batch (a stub of fixed latency, a
fixed concurrency limit) observed every tenth of a second while it runs, each ``eta_s`` compared
with how long the batch really took from that moment on."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import anyio
import pytest

from batchclient import RemoteBatchInference
from batchclient.testing import StubServer
from jobs_util import jsonl, line

LATENCY_S = 0.1
IN_FLIGHT = 4
LINES = 240  # 40 lines/s: a 6-second batch


@pytest.mark.slow
async def test_the_eta_of_a_steady_batch_is_right_from_its_first_seconds(tmp_path: Path) -> None:
    """From 1 s to 2.5 s into a 6 s batch, the ETA is within 1.2x of the time the batch
    really took to finish from then (the first rate came from the whole-second
    ``in_progress_at``, start-up and the first requests' latency included, and stayed for
    minutes: 1.6x too long for a batch started late in a second, which this one is on
    purpose)."""
    observed: list[tuple[float, float]] = []  # (time, eta_s)
    with StubServer(latency_s=LATENCY_S) as stub:
        async with RemoteBatchInference(
            stub.url, max_concurrency=IN_FLIGHT, adaptive=False, state_dir=tmp_path
        ) as client:
            record = await client.files.create(
                jsonl([line(f"q{i}", f"question {i}") for i in range(LINES)])
            )
            while not 0.6 <= time.time() % 1 < 0.7:  # late in a second, as a batch may be
                await anyio.sleep(0.005)
            batch = await client.batches.create(record.id)
            begun = time.time()  # validation (milliseconds) and the run start right after
            with anyio.fail_after(60):
                while True:
                    now = time.time()
                    batch = await client.batches.retrieve(batch.id)
                    counts = batch.request_counts
                    if counts.total and counts.completed + counts.failed == counts.total:
                        finished = now
                        break
                    if batch.progress is not None and batch.progress.eta_s is not None:
                        observed.append((now, batch.progress.eta_s))
                    await anyio.sleep(0.1)
            await client.batches.wait(batch.id)
    assert stub.stats.by_status[200] == LINES
    ratios = [eta / (finished - t) for t, eta in observed if 1.0 <= t - begun <= 2.5]
    assert len(ratios) >= 8, observed
    # The fault this guards against made the ETA too long (1.6x). A machine busy with other
    # work stretches the rest of the batch after the ETA was given, which makes the ETA read
    # short (0.8x measured beside the vLLM tests): the bounds are loose on that side only.
    within = [0.7 <= r <= 1.2 for r in ratios]
    assert sum(within) >= 0.8 * len(ratios) and min(ratios) >= 0.5 and max(ratios) <= 1.35, ratios
    assert 0.75 <= statistics.median(ratios) <= 1.15, ratios
