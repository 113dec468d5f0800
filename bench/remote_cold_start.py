"""Whole calls from a cold client against servers of unknown capacity: how close the adaptive
controller comes to a client told the capacity, from the first request on.

The stub (its own process, uvloop) answers in 100 ms and serves at most ``C`` requests at once;
above that it refuses in one of several ways (``--variants``): after working as long as a
success takes or at once, 429 or 503, with ``Retry-After: 1`` or without. Each round runs the
same ``--requests`` one-message calls (``batch_chat_completion``) twice, each against a fresh
stub and with a new client: ``adaptive=False, max_concurrency=C`` (told the capacity) and the
defaults (adaptive). Reported per capacity and variant (medians of ``--repeats`` rounds, the two
kinds alternating): requests/s of each, their ratio (goal >= 0.90) and the share of refused
answers of the default client (goal < 3 %).

``--change`` measures instead a capacity that changes mid-call: 24 until 4 s after the stub
starts, then 48 (doubles) or 12 (halves); the seconds from the change until the rate is back at
90 % of the new capacity's (goal <= 3 s): the first moment from which the completions of the
next second reach it, from the call's progress sampled every 0.2 s.

    python bench/remote_cold_start.py [--capacities 8,24,96] [--repeats 3]
    python bench/remote_cold_start.py --change

Writes bench/results/remote_cold_start.json (``_change`` with ``--change``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from batchclient import RemoteBatchInference
from batchclient.testing import StubProcess

RESULTS = Path(__file__).parent / "results"
LATENCY_S = 0.1
VARIANTS: dict[str, list[str]] = {
    "queue-429-ra1": ["--reject-after-work", "--capacity-retry-after", "1"],
    "queue-503-ra1": ["--reject-after-work", "--capacity-status", "503",
                      "--capacity-retry-after", "1"],
    "queue-429": ["--reject-after-work"],
    "gateway-429-ra1": ["--capacity-retry-after", "1"],
    "queue-429-date": ["--reject-after-work", "--capacity-retry-after", "date:1"],
}  # fmt: skip
CHANGE_AT_S = 4.0


def stub_args(capacity: int, variant: str, *extra: str) -> list[str]:
    args = ["--latency", str(LATENCY_S), "--capacity", str(capacity), "--uvloop"]
    return args + VARIANTS[variant] + list(extra)


async def call(url: str, n: int, fixed: int | None) -> dict[str, Any]:
    """``n`` requests through a new client; ``fixed``: ``adaptive=False`` at that many."""
    options: dict[str, Any] = {} if fixed is None else {"adaptive": False, "max_concurrency": fixed}
    messages = [[{"role": "user", "content": f"question {i}"}] for i in range(n)]
    progress: list[tuple[float, int]] = []
    async with RemoteBatchInference(url, **options) as client:
        started = time.monotonic()
        result = await client.batch_chat_completion(
            "smollm2",
            messages,
            progress=lambda p: progress.append((time.monotonic() - started, p.completed)),
        )
        elapsed = time.monotonic() - started
        limit = client.provider.concurrency_limit()
    return {
        "elapsed_s": elapsed,
        "req_per_s": n / elapsed,
        "failed": len(result.errors),
        "final_limit": limit,
        "progress": progress,
    }


def one(capacity: int, variant: str, n: int, fixed: int | None, *extra: str) -> dict[str, Any]:
    with StubProcess(*stub_args(capacity, variant, *extra)) as stub:
        report = asyncio.run(call(stub.url, n, fixed))
        server = stub.stats()
    total = server["requests"]
    refused = sum(v for k, v in server["by_status"].items() if k in ("429", "503"))
    report.update(server_requests=total, refused=refused, share_refused=refused / max(1, total))
    return report


def measure(capacities: list[int], variants: list[str], n: int, repeats: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for capacity in capacities:
        for variant in variants:
            fixed_rates, default_rates, refused = [], [], []
            for _ in range(repeats):
                fixed = one(capacity, variant, n, capacity)
                default = one(capacity, variant, n, None)
                fixed_rates.append(fixed["req_per_s"])
                default_rates.append(default["req_per_s"])
                refused.append(default["share_refused"])
                assert fixed["failed"] == default["failed"] == 0, (fixed, default)
            ratios = [d / f for d, f in zip(default_rates, fixed_rates, strict=True)]
            ratio = statistics.median(ratios)
            row = {
                "fixed_req_per_s": statistics.median(fixed_rates),
                "default_req_per_s": statistics.median(default_rates),
                "ratio": ratio,
                "ratios": ratios,
                "default_share_refused": statistics.median(refused),
                "goal_met": ratio >= 0.9 and statistics.median(refused) < 0.03,
            }
            rows[f"C={capacity} {variant}"] = row
            print(f"C={capacity:>3} {variant:>16}: default {row['default_req_per_s']:6.1f} "
                  f"vs fixed {row['fixed_req_per_s']:6.1f} req/s = {ratio:.2f}; refused "
                  f"{row['default_share_refused']:.1%}", flush=True)  # fmt: skip
    return {"requests": n, "repeats": repeats, "latency_s": LATENCY_S, "runs": rows}


def recovery_s(progress: list[tuple[float, int]], change_s: float, rate: float) -> float | None:
    """Seconds from ``change_s`` until the rate is back at 90 % of ``rate``: the first sample
    from which the completions of the next second reach it."""
    for i, (t, done) in enumerate(progress):
        if t < change_s:
            continue
        ahead = next((p for p in progress[i:] if p[0] >= t + 1.0), None)
        if ahead is not None and (ahead[1] - done) / (ahead[0] - t) >= 0.9 * rate:
            return t - change_s
    return None


def measure_change(repeats: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for new in (48, 12):
        for variant in ("queue-429-ra1", "gateway-429-ra1"):
            n = int(24 / LATENCY_S * CHANGE_AT_S + new / LATENCY_S * 6)
            times = []
            for _ in range(repeats):
                run = one(24, variant, n, None, "--capacity-at", f"{CHANGE_AT_S}:{new}")
                # the stub's clock starts before the client's: the change comes a little
                # earlier in the client's time than CHANGE_AT_S (recovery reads that much long)
                times.append(recovery_s(run["progress"], CHANGE_AT_S, new / LATENCY_S))
            known = [t for t in times if t is not None]
            rows[f"24->{new} {variant}"] = {
                "recovery_s": times,
                "median_s": statistics.median(known) if len(known) == len(times) else None,
            }
            print(f"24 -> {new} {variant}: 90 % of the new rate after {times} s", flush=True)
    return {"change_at_s": CHANGE_AT_S, "runs": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--capacities", default="8,24,96")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--requests", type=int, default=1200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--change", action="store_true", help="capacity doubling and halving mid-call")
    args = p.parse_args()
    if args.change:
        report = measure_change(args.repeats)
        name = "remote_cold_start_change"
    else:
        caps = [int(c) for c in args.capacities.split(",")]
        report = measure(caps, args.variants.split(","), args.requests, args.repeats)
        name = "remote_cold_start"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"benchmark": name, **report}, indent=1))


if __name__ == "__main__":
    main()
