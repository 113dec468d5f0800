"""The ETA of a running batch, end to end: a steady batch (a stub of fixed latency, a fixed
concurrency limit) observed every tenth of a second while it runs; the rate each ``progress``
gives is compared with the rate the batch really ran at up to that moment (from its first
answer, as the stub saw it). The future is not the yardstick: a machine busy with other work
speeds the rest of a batch up or slows it down (0.8x and 1.4x were measured beside the vLLM
tests), which no estimate can know; the arithmetic of the smoothing is checked on a fake clock
in ``tests/server/test_server_ops.py``."""

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
    """From 1 s to 4 s into a batch, the rate behind the ETA is within 1.25x of the rate
    the batch ran at since its first answer (the first rate came from the whole-second
    ``in_progress_at``, start-up and the first requests' latency included, and stayed for
    minutes: 1.6x too slow for a batch started late in a second, which this one is on
    purpose), and the ETA is the lines left at that rate."""
    observed: list[tuple[float, int, float, float]] = []  # (time, lines done, rate, eta_s)
    to_unix = time.time() - time.monotonic()
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
                    done = counts.completed + counts.failed
                    if counts.total and done == counts.total:
                        break
                    progress = batch.progress
                    if progress is not None and progress.requests_per_s and progress.eta_s:
                        observed.append((now, done, progress.requests_per_s, progress.eta_s))
                    await anyio.sleep(0.1)
            await client.batches.wait(batch.id)
        first_answer = to_unix + min(stub.stats.arrivals) + LATENCY_S
    assert stub.stats.by_status[200] == LINES
    young = [o for o in observed if 1.0 <= o[0] - begun <= 4.0]
    assert len(young) >= 5, observed
    ratios = [rate / (done / (t - first_answer)) for t, done, rate, _ in young]
    # each look within 2x (a busy machine's pause moves one look); their median within 1.25x
    assert all(0.5 <= r <= 2.0 for r in ratios), ratios
    assert 0.8 <= statistics.median(ratios) <= 1.25, ratios
    for _, done, rate, eta_s in young:
        assert eta_s == pytest.approx((LINES - done) / rate, rel=0.05)
