"""Adaptive concurrency against servers of unknown capacity that say no in different ways.

The stub (its own process) answers in 100 ms and serves at most 24 requests at once: the ideal is
24 / 0.1 s = 240 requests/s. Above that it refuses, and the variants differ in how:

- **when**: at once (``gateway``: a proxy counting connections) or only after working on the
  request as long as a success takes (``queue``: an overloaded backend behind a queue, which
  gives up on a request after holding it);
- **status**: 429 or 503;
- **Retry-After**: none, ``1`` (seconds) or an HTTP date one second ahead;
- **capacity**: fixed, or changing mid-run (24, then 48 from 10 s, then 12 from 20 s).

The client runs with its defaults (adaptive on, ``max_concurrency`` 64, no rate limits). Goal for
every variant: successful requests/s from 10 s on >= 90 % of what the capacity allows then, and
< 5 % of the requests refused.

Reported per variant: successful requests/s per second of the run, the mean from 10 s on and its
share of the ideal (the ideal of each second follows the capacity schedule), the refused share,
the concurrency limit every 100 ms, and the mean latency of a success (on a loaded machine it
exceeds 100 ms, and capacity / latency is then the best rate possible: reported as well).

    python bench/remote_adaptation.py [--seconds 30] [--only queue-429-ra1,changing]

Writes ``bench/results/remote_adaptation.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchclient import RemoteBatchInference
from batchclient.testing import StubProcess

RESULTS = Path(__file__).parent / "results"
CAPACITY, LATENCY_S = 24, 0.1
IDEAL = CAPACITY / LATENCY_S
CHANGES = ((10.0, 48), (20.0, 12))  # the changing-capacity variant: (from second, capacity)


@dataclass(frozen=True)
class Variant:
    name: str
    after_work: bool
    status: int = 429
    retry_after: str | None = None  # "1" or "date:1"
    changing: bool = False

    def stub_args(self) -> list[str]:
        args = ["--latency", str(LATENCY_S), "--capacity", str(CAPACITY), "--uvloop"]
        args += ["--capacity-status", str(self.status)]
        if self.after_work:
            args.append("--reject-after-work")
        if self.retry_after is not None:
            args += ["--capacity-retry-after", self.retry_after]
        if self.changing:
            for at, capacity in CHANGES:
                args += ["--capacity-at", f"{at:g}:{capacity}"]
        return args

    def ideal_at(self, second: float) -> float:
        capacity = CAPACITY
        if self.changing:
            for at, value in CHANGES:
                if second >= at:
                    capacity = value
        return capacity / LATENCY_S


VARIANTS = [
    Variant("gateway-429", after_work=False),
    Variant("gateway-429-ra1", after_work=False, retry_after="1"),
    Variant("gateway-503-date", after_work=False, status=503, retry_after="date:1"),
    Variant("queue-429", after_work=True),
    Variant("queue-429-ra1", after_work=True, retry_after="1"),
    Variant("queue-503", after_work=True, status=503),
    Variant("queue-503-date", after_work=True, status=503, retry_after="date:1"),
    Variant("changing-queue-429-ra1", after_work=True, retry_after="1", changing=True),
    Variant("changing-gateway-429", after_work=False, changing=True),
]


async def run(url: str, variant: Variant, seconds: float) -> dict[str, Any]:
    n = int(sum(variant.ideal_at(s) for s in range(int(seconds))))
    messages = [[{"role": "user", "content": f"question {i}"}] for i in range(n)]
    limits: list[tuple[float, int]] = []
    done_at: list[float] = []
    async with RemoteBatchInference(url) as client:
        started = time.monotonic()

        async def watch() -> None:
            while True:
                limits.append(
                    (round(time.monotonic() - started, 2), client.provider.concurrency_limit() or 0)
                )
                await asyncio.sleep(0.1)

        watcher = asyncio.create_task(watch())
        last = [0]

        def progress(p: Any) -> None:  # completions, sampled every 0.2 s
            now = time.monotonic() - started
            done_at.extend([now] * (p.completed - last[0]))
            last[0] = p.completed

        result = await client.batch_chat_completion("smollm2", messages, progress=progress)
        elapsed = time.monotonic() - started
        watcher.cancel()
        stats = client.replica_stats()[0]
    per_second = [0] * (int(elapsed) + 1)
    for t in done_at:
        per_second[int(t)] += 1
    latencies = [r.metric("latency") for r in result.batch if r.error is None]
    latency = sum(x for x in latencies if x is not None) / max(1, len(latencies))
    tail = range(10, int(elapsed))  # whole seconds from 10 s on
    done_tail = sum(per_second[s] for s in tail)
    ideal_tail = sum(variant.ideal_at(s) for s in tail)
    return {
        "requests": n,
        "failed": len(result.errors),
        "elapsed_s": round(elapsed, 2),
        "overall_req_per_s": round(n / elapsed, 1),
        "req_per_s_by_second": per_second,
        "mean_req_per_s_after_10s": round(done_tail / len(tail), 1) if tail else None,
        "share_of_ideal_after_10s": round(done_tail / ideal_tail, 3) if ideal_tail else None,
        # the same against capacity / the measured mean latency of a success
        "share_of_best_at_measured_latency_after_10s": (
            round(done_tail / ideal_tail * latency / LATENCY_S, 3) if ideal_tail else None
        ),
        # on a loaded machine an answer takes longer than the stub's 100 ms; at capacity the
        # best possible rate is then capacity / latency, not 240
        "mean_latency_s": round(latency, 4),
        "client_throttles": stats.throttled,
        "limit_cuts": stats.cuts,
        "concurrency_limit_every_100ms": limits,
    }


def one(variant: Variant, seconds: float) -> dict[str, Any]:
    with StubProcess(*variant.stub_args()) as stub:
        report = asyncio.run(run(stub.url, variant, seconds))
        server = stub.stats()
    total = server["requests"]
    refused = server["by_status"].get(str(variant.status), 0)
    share = report["share_of_ideal_after_10s"] or 0.0
    report.update(
        server_requests=total,
        server_refused=refused,
        share_refused=round(refused / total, 4) if total else None,
        goal_throughput_met=share >= 0.9,
        goal_refused_met=bool(total and refused / total < 0.05),
    )
    final_limits = [v for _, v in report["concurrency_limit_every_100ms"][-50:]]
    at_latency = report["share_of_best_at_measured_latency_after_10s"] or 0.0
    print(f"{variant.name:>24}: from 10 s on {report['mean_req_per_s_after_10s']} req/s "
          f"({share:.0%} of the ideal, {at_latency:.0%} at the measured latency); "
          f"refused {refused}/{total} "
          f"({report['share_refused']:.1%}); failed {report['failed']}; "
          f"limit over the last 5 s {min(final_limits)}-{max(final_limits)}",
          flush=True)  # fmt: skip
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of a run")
    parser.add_argument("--only", default="", help="comma-separated variant names")
    args = parser.parse_args()
    chosen = [v for v in VARIANTS if not args.only or v.name in args.only.split(",")]
    report: dict[str, Any] = {
        "benchmark": "remote_adaptation",
        "ideal_req_per_s": IDEAL,
        "capacity_changes": CHANGES,
        "goal_share_of_ideal_after_10s": 0.9,
        "goal_share_refused_below": 0.05,
        "load_avg_at_start": os.getloadavg(),
        "runs": {v.name: one(v, args.seconds) for v in chosen},
    }
    report["goals_met"] = all(
        r["goal_throughput_met"] and r["goal_refused_met"] for r in report["runs"].values()
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "remote_adaptation.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
