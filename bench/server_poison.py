"""One tenant's poison requests against everyone else's: tenant A's requests make the only
upstream drop the connection; how long do tenant B's ordinary requests take right after?

A loopback stub (50 ms latency) drops the connection of every request whose text contains
"poison"; ``batchclient serve --max-retries 1`` in front of it, with two keys. Each round: B's
``--calls`` ordinary one-request calls one at a time (alone); then A's ``--poison`` poison calls
at once; then B's calls again, one at a time. Reported: B's median and worst latency alone and
right after A's, and the statuses and OpenAI error types A got (a dropped connection is the
upstream's failure: 502 with ``server_error``, not a client error).

``--src DIR`` runs the server from another source tree (an older checkout, to compare).

    python bench/server_poison.py [--poison 4] [--calls 3] [--repeats 5]

Writes bench/results/server_poison[_<label>].json (``_<label>`` with ``--src``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from _jobs_common import save
from _server_common import add_src_options, serve, use_src
from batchclient.testing import Fault, StubReply, StubServer

KEY_A = "bench-tenant-a-0123456789"
KEY_B = "bench-tenant-b-9876543210"


def _call(url: str, key: str, text: str) -> tuple[float, int, str | None]:
    """(seconds, status, error type) of one ``POST /v1/chat/completions``."""
    body = {"model": "smollm2", "messages": [{"role": "user", "content": text}], "max_tokens": 8}
    started = time.perf_counter()
    resp = httpx.post(
        f"{url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    took = time.perf_counter() - started
    kind = None if resp.is_success else resp.json().get("error", {}).get("type")
    return took, resp.status_code, kind


def measure(poison: int, calls: int, repeats: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    faults = [Fault(StubReply(action="reset"), match="poison")]
    with (
        tempfile.TemporaryDirectory() as name,
        StubServer(latency_s=0.05, faults=faults) as stub,
    ):
        extra = ("--max-retries", "1", "--api-key", KEY_A, "--api-key", KEY_B)
        with serve(stub.url, Path(name) / "state", *extra) as (url, _):
            _call(url, KEY_B, "warm-up")
            for r in range(repeats):
                alone = [_call(url, KEY_B, f"alone {r}.{i}") for i in range(calls)]
                texts = [f"poison {r}.{i}" for i in range(poison)]
                with ThreadPoolExecutor(poison) as pool:
                    a = list(pool.map(lambda text: _call(url, KEY_A, text), texts))
                after = [_call(url, KEY_B, f"after {r}.{i}") for i in range(calls)]
                rows.append(
                    {
                        "b_alone_s": [t for t, _, _ in alone],
                        "b_after_poison_s": [t for t, _, _ in after],
                        "b_statuses_after": [s for _, s, _ in after],
                        "a_answers": [f"{s} {kind}" for _, s, kind in a],
                    }
                )
    alone_s = [t for row in rows for t in row["b_alone_s"]]
    after_s = [t for row in rows for t in row["b_after_poison_s"]]
    return {
        "poison": poison,
        "calls": calls,
        "rounds": rows,
        "b_alone_median_s": statistics.median(alone_s),
        "b_after_poison_median_s": statistics.median(after_s),
        "b_after_poison_max_s": max(after_s),
        "b_all_answered": all(s == 200 for row in rows for s in row["b_statuses_after"]),
        "a_answers": dict(Counter(a for row in rows for a in row["a_answers"])),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--poison", type=int, default=4, help="tenant A's poison calls (default 4)")
    p.add_argument("--calls", type=int, default=3, help="tenant B's calls per round (default 3)")
    p.add_argument("--repeats", type=int, default=5, help="rounds (default 5)")
    add_src_options(p)
    args = p.parse_args()
    use_src(args.src)
    figures = measure(args.poison, args.calls, args.repeats)
    figures["target"] = "stub in this process, 50 ms latency; serve --max-retries 1, two keys"
    figures["server_src"] = "another checkout" if args.src else "this checkout"
    path = save(f"server_poison_{args.label}" if args.src else "server_poison", figures)
    print(
        f"B's calls: alone median {figures['b_alone_median_s'] * 1000:.0f} ms; right after A's "
        f"{args.poison} poison calls median {figures['b_after_poison_median_s'] * 1000:.0f} ms, "
        f"worst {figures['b_after_poison_max_s'] * 1000:.0f} ms, all answered: "
        f"{figures['b_all_answered']}; A got {figures['a_answers']}\nwrote {path}"
    )


if __name__ == "__main__":
    main()
