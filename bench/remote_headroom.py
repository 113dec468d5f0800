"""Client headroom: requests/s through ``batch_chat_completion`` against an instant stub.

The stub (``python -m batchclient.testing stub --fast``, on uvloop) runs in its own process
pinned to one core; the client runs in this process pinned to another, on the default asyncio
loop, with 256 requests in flight. Target: >= 5,000 requests/s.

For context the same run measures bare aiohttp (one shared session, a semaphore of 256, JSON
encode/decode, nothing else) against the same stub, and, with ``--uvloop``, the client on
uvloop. Reported: the median of ``--runs`` runs, requests per wall second and per client
CPU-second (the latter is steadier on a shared machine).

    python bench/remote_headroom.py [--requests 20000] [--runs 5] [--uvloop]

Writes ``bench/results/remote_headroom.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from batchclient import RemoteBatchInference
from batchclient.testing import StubProcess

RESULTS = Path(__file__).parent / "results"


def pin(core: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {core})


async def run_client(url: str, n: int, in_flight: int) -> dict[str, float]:
    messages = [[{"role": "user", "content": f"Say hello to number {i}."}] for i in range(n)]
    async with RemoteBatchInference(url, max_concurrency=in_flight) as client:
        await client.batch_chat_completion("smollm2", messages[:2000])  # warm: connections, limit
        wall, cpu = time.perf_counter(), time.process_time()
        result = await client.batch_chat_completion("smollm2", messages)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        limit = client.provider.concurrency_limit()
    errors = len(result.errors)
    if errors:
        raise SystemExit(f"{errors} requests failed: {result.errors[0]}")
    return {"req_per_s": n / wall, "req_per_cpu_s": n / cpu, "concurrency_limit": limit or 0}


async def run_bare_aiohttp(url: str, n: int, in_flight: int) -> dict[str, float]:
    import aiohttp

    body = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": "Hello"}]})
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        semaphore = asyncio.Semaphore(in_flight)

        async def one() -> None:
            async with semaphore, session.post(f"{url}/chat/completions", data=body,
                                               headers=headers) as resp:  # fmt: skip
                json.loads(await resp.read())

        await asyncio.gather(*(one() for _ in range(2000)))
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one() for _ in range(n)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"req_per_s": n / wall, "req_per_cpu_s": n / cpu}


def median_of(runs: list[dict[str, float]], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--uvloop", action="store_true", help="also measure the client on uvloop")
    args = parser.parse_args()

    report: dict[str, Any] = {
        "benchmark": "remote_headroom",
        "goal_req_per_s": 5000,
        "requests_per_run": args.requests,
        "in_flight": args.in_flight,
        "runs": args.runs,
        "cpu_count": os.cpu_count(),
        "load_avg_at_start": os.getloadavg(),
        "python": sys.version.split()[0],
    }
    with StubProcess("--fast", "--cpu", "1", "--uvloop") as stub:
        pin(0)
        modes = [("batchclient", run_client), ("bare_aiohttp", run_bare_aiohttp)]
        for name, fn in modes:
            runs = [
                asyncio.run(fn(stub.url, args.requests, args.in_flight)) for _ in range(args.runs)
            ]
            report[name] = {
                "median_req_per_s": median_of(runs, "req_per_s"),
                "median_req_per_cpu_s": median_of(runs, "req_per_cpu_s"),
                "runs": runs,
            }
            summary = report[name]
            print(f"{name:>14}: median {summary['median_req_per_s']:8.0f} req/s "
                  f"({summary['median_req_per_cpu_s']:.0f} per client CPU-second)")  # fmt: skip
        if args.uvloop:
            import uvloop

            runs = [
                uvloop.run(run_client(stub.url, args.requests, args.in_flight))
                for _ in range(args.runs)
            ]
            report["batchclient_uvloop"] = {
                "median_req_per_s": median_of(runs, "req_per_s"),
                "median_req_per_cpu_s": median_of(runs, "req_per_cpu_s"),
                "runs": runs,
            }
            print(f"{'uvloop':>14}: median {report['batchclient_uvloop']['median_req_per_s']:8.0f}"
                  " req/s")  # fmt: skip
        report["stub_stats"] = stub.stats()
    ours = report["batchclient"]["median_req_per_s"]
    report["goal_met"] = ours >= 5000
    report["ratio_to_bare_aiohttp"] = round(ours / report["bare_aiohttp"]["median_req_per_s"], 2)
    print(f"goal >= 5,000 req/s: {'met' if report['goal_met'] else 'NOT met'} ({ours:.0f}); "
          f"{report['ratio_to_bare_aiohttp']}x bare aiohttp")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "remote_headroom.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
