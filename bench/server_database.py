"""``batchclient serve`` on a shared PostgreSQL against the same server on its SQLite file, and
two servers on one PostgreSQL against one (goals: PostgreSQL within 20 % of SQLite; two
processes at least 1.6x one).

The provider is the stub server in its own process, 50 ms latency; each server has 64 requests
in flight. The PostgreSQL server is a real one started for the run (the distribution's
programs, ``batchclient.testing.PostgresServer``, ``fsync=off``), on this machine.

- ``sqlite`` / ``postgres``: one server each, started beforehand; the openai SDK uploads an
  ``--n``-line file, creates the batch, polls every 0.25 s and downloads the output; the two
  alternate, ``--repeats`` rounds, order reversed every other round. Ratio of medians.
- ``one_process`` / ``two_processes``: ``--batches`` batches of ``--n`` lines created at once,
  all on one server, or alternately on two servers sharing one database (what a load balancer
  in front of them does); the time until every batch is completed. Ratio of medians.
- ``one_batch_one_process`` / ``one_batch_two_processes``: one batch of ``--batches`` x
  ``--n`` lines created on the first server; the second takes blocks of its lines.

The one-process rounds run before the second server starts (a running second server helps
with every batch), so those two pairs are measured one after the other, not alternately.

Every process of the run shares this machine's cores: the stub, the servers, PostgreSQL and the
SDK clients. Two servers can only beat one by the cores left idle by one.

    python bench/server_database.py [--n 1000] [--repeats 5] [--batches 4]
        [--max-concurrency 64]

With 64 in flight a server here is bound by this machine's cores, which every process shares:
a second server on the same cores adds little. ``--max-concurrency 16`` bounds each server by
its own window instead (as a server on its own host is bound by its own cores), which shows
what the shared database lets two servers do together.

Writes bench/results/server_database.json (``_16`` etc. for another window).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import openai

from _jobs_common import save, stub_process, write_input
from _server_common import run_batch, serve
from batchclient.testing import PostgresServer

POLL_S = 0.25


def one_batch(client: openai.OpenAI, inp: Path, n: int) -> float:
    """Seconds from the upload to the downloaded output of one batch."""
    started = time.perf_counter()
    run_batch(client, inp, n, POLL_S)
    return time.perf_counter() - started


def many_batches(clients: list[openai.OpenAI], inp: Path, n: int, batches: int) -> float:
    """Seconds until ``batches`` batches, created at once round-robin over ``clients``, are
    all completed."""
    errors: list[BaseException] = []

    def go(i: int) -> None:
        try:
            one_batch(clients[i % len(clients)], inp, n)
        except BaseException as exc:  # reported after the join
            errors.append(exc)

    started = time.perf_counter()
    threads = [threading.Thread(target=go, args=(i,)) for i in range(batches)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return time.perf_counter() - started


def sdk(url: str) -> openai.OpenAI:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    client.chat.completions.create(  # warm-up: connections, model check
        model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=1
    )
    return client


def measure(n: int, repeats: int, batches: int, window: int) -> dict[str, Any]:
    serve_args = ("--max-concurrency", str(window))
    wall: dict[str, list[float]] = {
        m: []
        for m in (
            "sqlite",
            "postgres",
            "one_process",
            "two_processes",
            "one_batch_one_process",
            "one_batch_two_processes",
        )
    }
    with (
        tempfile.TemporaryDirectory() as name,
        stub_process(latency_s=0.05) as stub,
        PostgresServer() as pg,
    ):
        tmp = Path(name)
        inp = write_input(tmp / "in.jsonl", n, max_tokens=8)
        big = write_input(tmp / "big.jsonl", n * batches, max_tokens=8)
        database = pg.database()
        pg_args = ("--database", database, *serve_args)
        with (
            serve(stub, tmp / "sqlite", *serve_args) as (lite_url, _),
            serve(stub, tmp / "pg1", *pg_args) as (pg1_url, _),
        ):
            clients = {"sqlite": sdk(lite_url), "postgres": sdk(pg1_url)}
            for r in range(repeats):
                for mode in ("sqlite", "postgres")[:: 1 if r % 2 == 0 else -1]:
                    wall[mode].append(one_batch(clients[mode], inp, n))
            # the second server is not running yet: one process does everything
            for _ in range(repeats):
                wall["one_process"].append(many_batches([clients["postgres"]], inp, n, batches))
                took = one_batch(clients["postgres"], big, n * batches)
                wall["one_batch_one_process"].append(took)
            with serve(stub, tmp / "pg2", *pg_args) as (pg2_url, _):
                pair = [clients["postgres"], sdk(pg2_url)]
                for _ in range(repeats):
                    wall["two_processes"].append(many_batches(pair, inp, n, batches))
                    took = one_batch(clients["postgres"], big, n * batches)
                    wall["one_batch_two_processes"].append(took)
    median = {m: statistics.median(v) for m, v in wall.items()}
    return {
        "n": n,
        "batches": batches,
        "wall_s": wall,
        "requests_per_s": {
            "sqlite": n / median["sqlite"],
            "postgres": n / median["postgres"],
            "one_process": batches * n / median["one_process"],
            "two_processes": batches * n / median["two_processes"],
            "one_batch_one_process": batches * n / median["one_batch_one_process"],
            "one_batch_two_processes": batches * n / median["one_batch_two_processes"],
        },
        "ratio_postgres_over_sqlite": median["sqlite"] / median["postgres"],
        "ratio_two_over_one": median["one_process"] / median["two_processes"],
        "ratio_one_batch_two_over_one": median["one_batch_one_process"]
        / median["one_batch_two_processes"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1000, help="request lines per batch (default 1000)")
    p.add_argument("--repeats", type=int, default=5, help="rounds of each (default 5)")
    p.add_argument("--batches", type=int, default=4, help="batches at once (default 4)")
    p.add_argument(
        "--max-concurrency", type=int, default=64, help="each server's requests in flight"
    )
    args = p.parse_args()
    figures = measure(args.n, args.repeats, args.batches, args.max_concurrency)
    figures["max_concurrency"] = args.max_concurrency
    figures["target"] = (
        f"stub, 50 ms latency, {args.max_concurrency} in flight per server; polled every 0.25 s"
    )
    figures["goal_postgres_within_20_percent"] = figures["ratio_postgres_over_sqlite"] >= 0.8
    figures["goal_two_at_least_1_6x"] = figures["ratio_two_over_one"] >= 1.6
    name = "server_database" + ("" if args.max_concurrency == 64 else f"_{args.max_concurrency}")
    path = save(name, figures)
    rate = figures["requests_per_s"]
    print(
        f"{args.n} lines, medians of {args.repeats}: SQLite {rate['sqlite']:.0f} req/s, "
        f"PostgreSQL {rate['postgres']:.0f} req/s (ratio "
        f"{figures['ratio_postgres_over_sqlite']:.3f}); {args.batches} batches at once: one "
        f"process {rate['one_process']:.0f} req/s, two {rate['two_processes']:.0f} req/s "
        f"(ratio {figures['ratio_two_over_one']:.3f}); one batch of "
        f"{args.batches * args.n} lines: one process {rate['one_batch_one_process']:.0f} req/s, "
        f"two {rate['one_batch_two_processes']:.0f} req/s (ratio "
        f"{figures['ratio_one_batch_two_over_one']:.3f})\nwrote {path}"
    )


if __name__ == "__main__":
    main()
