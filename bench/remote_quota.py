"""A quota gateway: 100 requests per 1-second window, announced in OpenAI's ``x-ratelimit-*``
headers, and a client with no ``rpm`` set.

The stub (its own process) answers in 100 ms and allows 100 requests per fixed 1-second window;
a request over the quota gets 429 (with ``Retry-After``: the seconds to the window's end,
rounded up) and does not count. Every answer carries ``x-ratelimit-limit-requests``,
``x-ratelimit-remaining-requests`` and ``x-ratelimit-reset-requests`` (``230ms``). The client
runs with its defaults. Goal: >= 85 successful requests/s (of 100) and < 2 % of requests
answered 429.

Reported: successful requests/s over the whole seconds from 2 s on (the first window starts
when the stub does, before the client), per second, and the 429 share; the same run without the
headers shows what they are worth.

    python bench/remote_quota.py [--seconds 20]

Writes ``bench/results/remote_quota.json``.
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
QUOTA, WINDOW_S, LATENCY_S = 100, 1.0, 0.1


async def run(url: str, seconds: float) -> dict[str, Any]:
    n = int(QUOTA / WINDOW_S * seconds)
    messages = [[{"role": "user", "content": f"question {i}"}] for i in range(n)]
    done_at: list[float] = []
    async with RemoteBatchInference(url, max_retries=20) as client:
        started = time.monotonic()
        last = [0]

        def progress(p: Any) -> None:
            now = time.monotonic() - started
            done_at.extend([now] * (p.completed - last[0]))
            last[0] = p.completed

        result = await client.batch_chat_completion("smollm2", messages, progress=progress)
        elapsed = time.monotonic() - started
        stats = client.endpoint_stats()[0]
    per_second = [0] * (int(elapsed) + 1)
    for t in done_at:
        per_second[int(t)] += 1
    steady = per_second[2 : int(elapsed)]
    return {
        "requests": n,
        "failed": len(result.errors),
        "elapsed_s": round(elapsed, 2),
        "req_per_s_by_second": per_second,
        "req_per_s_from_2s": round(sum(steady) / len(steady), 1) if steady else None,
        "client_throttles": stats.throttled,
        "limit_cuts": stats.cuts,
    }


def one(seconds: float, headers: bool) -> dict[str, Any]:
    args = ["--latency", str(LATENCY_S), "--quota", f"{QUOTA}:{WINDOW_S}", "--quota-retry-after"]
    with StubProcess(*args, *([] if headers else ["--no-quota-headers"])) as stub:
        report = asyncio.run(run(stub.url, seconds))
        server = stub.stats()
    total = server["requests"]
    throttled = server["by_status"].get("429", 0)
    rate = report["req_per_s_from_2s"] or 0.0
    report.update(
        headers=headers,
        server_requests=total,
        server_429=throttled,
        share_429=round(throttled / total, 4) if total else None,
        goal_rate_met=rate >= 0.85 * QUOTA / WINDOW_S,
        goal_429_met=bool(total and throttled / total < 0.02),
    )
    print(f"headers {'on ' if headers else 'off'}: {rate} req/s from 2 s on "
          f"({rate / QUOTA:.0%} of the quota); 429s {throttled}/{total} "
          f"({report['share_429']:.1%}); failed {report['failed']}")  # fmt: skip
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of a run at 100/s")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "benchmark": "remote_quota",
        "quota_requests_per_window": QUOTA,
        "window_s": WINDOW_S,
        "goal_req_per_s": 0.85 * QUOTA / WINDOW_S,
        "goal_share_429_below": 0.02,
        "load_avg_at_start": os.getloadavg(),
        "headers_on": one(args.seconds, True),
        "headers_off": one(args.seconds, False),
    }
    report["goals_met"] = (
        report["headers_on"]["goal_rate_met"] and report["headers_on"]["goal_429_met"]
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "remote_quota.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
