"""Resilience: three stub endpoints in separate processes, one SIGKILLed mid-run.

Each stub answers in ``--latency`` seconds. The client spreads ``--requests`` over the three
with its defaults; once a third of them are answered one stub process is killed (the kernel
resets its open connections, like a crashed server). Target: every request succeeds.

Reported: failures (must be 0), per-endpoint answers, attempts beyond the first (the requests
that were in flight on the dead endpoint and went elsewhere), the killed endpoint's ejection,
the throughput before and after the kill.

    python bench/remote_resilience.py [--requests 15000] [--latency 0.05]

Writes ``bench/results/remote_resilience.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from batchclient import RemoteBatchInference
from batchclient.testing import StubProcess

RESULTS = Path(__file__).parent / "results"


async def run(stubs: list[StubProcess], n: int) -> dict[str, Any]:
    messages = [[{"role": "user", "content": f"question {i}"}] for i in range(n)]
    done: list[float] = []
    killed_at: list[float] = []
    async with RemoteBatchInference([s.url for s in stubs]) as client:
        started = time.monotonic()

        third_done = asyncio.Event()

        async def killer() -> None:
            await third_done.wait()
            await asyncio.to_thread(stubs[0].kill)
            killed_at.append(time.monotonic() - started)

        last = [0]

        def progress(p: Any) -> None:
            done.extend([time.monotonic() - started] * (p.done - last[0]))
            last[0] = p.done
            if p.done >= n // 3:
                third_done.set()

        task = asyncio.create_task(killer())
        result = await client.batch_chat_completion("smollm2", messages, progress=progress)
        elapsed = time.monotonic() - started
        await task
        stats = {s.url: s for s in client.replica_stats()}
    kill_t = killed_at[0]
    before = sum(1 for t in done if t < kill_t) / kill_t
    after = sum(1 for t in done if t >= kill_t) / max(elapsed - kill_t, 1e-9)
    dead = stats[stubs[0].url.rstrip("/")]
    return {
        "requests": n,
        "failed": len(result.errors),
        "first_errors": [e.model_dump() for _, e in result.errors[:3]],
        "elapsed_s": round(elapsed, 2),
        "killed_at_s": round(kill_t, 2),
        "req_per_s_before_kill": round(before, 1),
        "req_per_s_after_kill": round(after, 1),
        "endpoints": [
            {
                "url": s.url,
                "sent": s.sent,
                "succeeded": s.succeeded,
                "failed_attempts": s.failed,
                "ejected_at_end": s.ejected,
            }
            for s in stats.values()
        ],
        "killed_endpoint_failed_attempts": dead.failed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=15_000)
    parser.add_argument("--latency", type=float, default=0.05)
    args = parser.parse_args()
    stubs = [StubProcess("--latency", str(args.latency), "--uvloop") for _ in range(3)]
    for s in stubs:
        s.start()
    try:
        report = asyncio.run(run(stubs, args.requests))
    finally:
        for s in stubs:
            s.stop()
    report.update(
        benchmark="remote_resilience",
        latency_s=args.latency,
        load_avg_at_start=os.getloadavg(),
        goal_met=report["failed"] == 0,
    )
    print(f"{report['requests']} requests over 3 endpoints, one killed at "
          f"{report['killed_at_s']} s: {report['failed']} failed "
          f"({'goal met' if report['goal_met'] else 'goal NOT met'}); "
          f"{report['req_per_s_before_kill']} req/s before, "
          f"{report['req_per_s_after_kill']} after; the dead endpoint saw "
          f"{report['killed_endpoint_failed_attempts']} failed attempts")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "remote_resilience.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
