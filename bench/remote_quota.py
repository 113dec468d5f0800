"""Quota gateways that announce their quota in ``x-ratelimit-*`` headers, in each way servers
write them, and a client with no ``rpm`` / ``tpm`` set.

The stub (its own process) answers in 100 ms and allows a fixed quota per window (windows
aligned to the stub's start); a request over the quota gets 429 (with ``Retry-After``: the
seconds to the window's end, rounded up) and does not count. The variants differ in how every
answer announces the quota (``StubServer``'s ``quota_style``):

- ``openai``: ``x-ratelimit-limit/remaining/reset-requests``, the reset as a Go duration
  (``230ms``), 100 requests per 1 s;
- ``seconds``: the same with the reset in plain seconds (``0.23``);
- ``epoch``: the same with the reset as an epoch second (windows on the wall clock's seconds);
- ``azure``: ``x-ratelimit-remaining-requests`` only (no limit, no reset), 429s with
  ``retry-after-ms`` and ``Retry-After``, 100 requests per 1 s;
- ``generic``: unsuffixed ``x-ratelimit-limit/remaining/reset`` (a gateway in front of vLLM);
- ``tokens``: OpenAI's ``-tokens`` headers, 2,100 tokens per 1 s, each request 21 tokens (two
  prompt words and ``max_tokens`` 19): 100 requests/s;
- ``headers-off``: the OpenAI quota, not announced (what the headers are worth).

Goal for every announced variant: >= 85 % of the quota in successful requests/s and < 2 % of the
requests answered 429. Reported: successful requests/s over the whole seconds from 2 s on (the
first window starts when the stub does, before the client), per second, and the 429 share.

    python bench/remote_quota.py [--seconds 20] [--only openai,azure]

Writes ``bench/results/remote_quota.json``.
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

from batchclient import RemoteBatchInference, SamplingParams
from batchclient.testing import StubProcess

RESULTS = Path(__file__).parent / "results"
LATENCY_S = 0.1
MAX_TOKENS = 19  # + 2 prompt words = 21 tokens a request


@dataclass(frozen=True)
class Variant:
    name: str
    style: str = "openai"
    limit: int = 100
    window_s: float = 1.0
    tokens: bool = False
    announced: bool = True

    @property
    def req_per_s(self) -> float:
        per_request = 2 + MAX_TOKENS if self.tokens else 1
        return self.limit / per_request / self.window_s

    def stub_args(self) -> list[str]:
        quota = f"{self.limit}:{self.window_s:g}"
        args = ["--latency", str(LATENCY_S), "--quota-retry-after", "--uvloop"]
        args += ["--token-quota" if self.tokens else "--quota", quota]
        args += ["--quota-style", self.style]
        return args + ([] if self.announced else ["--no-quota-headers"])


VARIANTS = [
    Variant("openai"),
    Variant("seconds", style="seconds"),
    Variant("epoch", style="epoch"),
    Variant("azure", style="azure"),
    Variant("generic", style="generic"),
    Variant("tokens", limit=100 * (2 + MAX_TOKENS), tokens=True),
    Variant("headers-off", announced=False),
]


async def run(url: str, variant: Variant, seconds: float) -> dict[str, Any]:
    n = int(variant.req_per_s * seconds)
    messages = [[{"role": "user", "content": f"question {i}"}] for i in range(n)]
    done_at: list[float] = []
    async with RemoteBatchInference(url, max_retries=20) as client:
        started = time.monotonic()
        last = [0]

        def progress(p: Any) -> None:
            now = time.monotonic() - started
            done_at.extend([now] * (p.completed - last[0]))
            last[0] = p.completed

        result = await client.batch_chat_completion(
            "smollm2",
            messages,
            sampling_params=SamplingParams(max_tokens=MAX_TOKENS),
            progress=progress,
        )
        elapsed = time.monotonic() - started
        stats = client.replica_stats()[0]
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


def one(variant: Variant, seconds: float) -> dict[str, Any]:
    with StubProcess(*variant.stub_args()) as stub:
        report = asyncio.run(run(stub.url, variant, seconds))
        server = stub.stats()
    total = server["requests"]
    throttled = server["by_status"].get("429", 0)
    rate = report["req_per_s_from_2s"] or 0.0
    report.update(
        style=variant.style,
        announced=variant.announced,
        quota_req_per_s=variant.req_per_s,
        share_of_quota=round(rate / variant.req_per_s, 3),
        server_requests=total,
        server_429=throttled,
        share_429=round(throttled / total, 4) if total else None,
        goal_rate_met=rate >= 0.85 * variant.req_per_s,
        goal_429_met=bool(total and throttled / total < 0.02),
    )
    print(f"{variant.name:>12}: {rate} req/s from 2 s on ({report['share_of_quota']:.0%} of "
          f"the quota); 429s {throttled}/{total} ({report['share_429']:.1%}); "
          f"failed {report['failed']}", flush=True)  # fmt: skip
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of a run")
    parser.add_argument("--only", default="", help="comma-separated variant names")
    args = parser.parse_args()
    chosen = [v for v in VARIANTS if not args.only or v.name in args.only.split(",")]
    report: dict[str, Any] = {
        "benchmark": "remote_quota",
        "goal_share_of_quota": 0.85,
        "goal_share_429_below": 0.02,
        "load_avg_at_start": os.getloadavg(),
        "runs": {v.name: one(v, args.seconds) for v in chosen},
    }
    report["goals_met"] = all(
        r["goal_rate_met"] and r["goal_429_met"] for r in report["runs"].values() if r["announced"]
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "remote_quota.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
