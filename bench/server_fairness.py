"""Tenant B's small batch alone, and while tenant A's large batch runs, through one
``batchclient serve`` (goal: about its time alone x the active tenants, not after A).

The stub server in its own process (50 ms latency), ``batchclient serve --max-concurrency 64``
with two keys (two tenants) in another. Each round: B's ``--small``-line batch alone, timed from
``batches.create`` to ``completed`` (polled every 20 ms); then A's ``--large``-line batch is
created (``--a-batches``: split into that many batches) and, once it has run ``--head-start``
seconds, B's batch again, timed the same way.
Recorded besides: how many of A's lines finished while B ran (an equal share is about B's
size), A's rate before and while B ran (the gate is work-conserving: the capacity stays used),
and whether A was still running when B finished. A is cancelled after each round.

``--calls N`` measures one-request calls against batches instead, both ways: B's ``--small``
-line batch alone and while A keeps N one-request calls in flight (N loops, each sending its
next call when its last is answered, for at most 30 s); then B's one-request calls, one at a
time, alone and while A's ``--large``-line batch runs (median latency of ``--b-calls``
calls). With N above ``--max-concurrency`` the calls alone could hold every slot.

``--src DIR`` runs the server from another source tree (an older checkout, to compare with
first come, first served).

    python bench/server_fairness.py [--small 20] [--large 20000] [--repeats 3]
    python bench/server_fairness.py --calls 48 --max-concurrency 8 --small 200

Writes bench/results/server_fairness[_<a-batches>|_calls][_<label>].json (``_<label>`` with
``--src``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import openai

from _jobs_common import request_line, save, stub_process
from _server_common import add_src_options, serve, use_src

KEY_A = "bench-tenant-a-0123456789"
KEY_B = "bench-tenant-b-9876543210"
POLL_S = 0.02


@contextmanager
def _two_tenants(capacity: int) -> Iterator[tuple[Path, openai.OpenAI, openai.OpenAI]]:
    """``batchclient serve --max-concurrency CAPACITY`` over the stub (50 ms) with two keys;
    yields a temporary folder and the SDK clients of tenants A and B."""
    with tempfile.TemporaryDirectory() as name, stub_process(latency_s=0.05) as stub:
        tmp = Path(name)
        extra = ("--max-concurrency", str(capacity), "--api-key", KEY_A, "--api-key", KEY_B)
        with serve(stub, tmp / "state", *extra) as (url, _):
            a = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY_A, max_retries=0)
            b = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY_B, max_retries=0)
            yield tmp, a, b


def _upload(client: openai.OpenAI, path: Path, n: int) -> str:
    with path.open("w") as f:
        for i in range(n):
            f.write(request_line(i, max_tokens=8) + "\n")
    with path.open("rb") as f:
        return client.files.create(file=f, purpose="batch").id


def _run_b(client: openai.OpenAI, file_id: str) -> tuple[float, Any]:
    started = time.perf_counter()
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(POLL_S)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    return time.perf_counter() - started, batch


def _done(client: openai.OpenAI, batch_id: str) -> tuple[int, str]:
    batch = client.batches.retrieve(batch_id)
    counts = batch.request_counts
    assert counts is not None
    return counts.completed + counts.failed, batch.status


def measure(
    small: int, large: int, a_batches: int, repeats: int, head_start: float, capacity: int
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with _two_tenants(capacity) as (tmp, a, b):
        a_file = _upload(a, tmp / "a.jsonl", large // a_batches)
        b_file = _upload(b, tmp / "b.jsonl", small)
        _run_b(b, b_file)  # warm-up: connections, the model check, the adaptive limit
        for _ in range(repeats):
            alone_s, _batch = _run_b(b, b_file)
            big = [
                a.batches.create(
                    input_file_id=a_file,
                    endpoint="/v1/chat/completions",
                    completion_window="24h",
                ).id
                for _ in range(a_batches)
            ]
            time.sleep(head_start)
            a_before = sum(_done(a, batch_id)[0] for batch_id in big)
            t0 = time.perf_counter()
            shared_s, _batch = _run_b(b, b_file)
            during = [_done(a, batch_id) for batch_id in big]
            took = time.perf_counter() - t0
            a_after = sum(done for done, _ in during)
            for batch_id in big:
                with suppress(openai.ConflictError):  # finished meanwhile: nothing to stop
                    a.batches.cancel(batch_id)
            rows.append(
                {
                    "alone_s": alone_s,
                    "with_large_s": shared_s,
                    "a_lines_during_b": a_after - a_before,
                    "a_rate_before_per_s": a_before / head_start,
                    "a_rate_during_b_per_s": (a_after - a_before) / took,
                    "a_still_running": all(status == "in_progress" for _, status in during),
                }
            )
    alone = statistics.median(r["alone_s"] for r in rows)
    shared = statistics.median(r["with_large_s"] for r in rows)
    return {
        "small": small,
        "large": large,
        "a_batches": a_batches,
        "rounds": rows,
        "b_alone_s": alone,
        "b_with_large_s": shared,
        "ratio": shared / alone,
        "a_lines_during_b": statistics.median(r["a_lines_during_b"] for r in rows),
        "b_finished_before_a": all(r["a_still_running"] for r in rows),
    }


def _call(client: openai.OpenAI, text: str) -> float:
    started = time.perf_counter()
    client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": text}], max_tokens=8
    )
    return time.perf_counter() - started


CALLS_FOR_S = 30.0
"""A's calls stop after this long even if B's batch has not finished (where calls go first,
it would wait for them for ever)."""


@contextmanager
def _calls_in_flight(client: openai.OpenAI, n: int) -> Iterator[list[int]]:
    """``n`` loops of one-request calls until the block ends (at most :data:`CALLS_FOR_S`);
    yields the count answered."""
    answered = [0]
    stop = threading.Event()
    deadline = time.perf_counter() + CALLS_FOR_S

    def loop(i: int) -> None:
        while not stop.is_set() and time.perf_counter() < deadline:
            _call(client, f"call of loop {i}")
            answered[0] += 1

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    try:
        yield answered
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def measure_calls(
    calls: int, small: int, large: int, b_calls: int, repeats: int, head_start: float,
    capacity: int,
) -> dict[str, Any]:  # fmt: skip
    rows: list[dict[str, Any]] = []
    with _two_tenants(capacity) as (tmp, a, b):
        a_file = _upload(a, tmp / "a.jsonl", large)
        b_file = _upload(b, tmp / "b.jsonl", small)
        _run_b(b, b_file)  # warm-up: connections, the model check, the adaptive limit
        for _ in range(repeats):
            alone_s, _batch = _run_b(b, b_file)
            with _calls_in_flight(a, calls) as answered:
                time.sleep(head_start)
                before = answered[0]
                shared_s, _batch = _run_b(b, b_file)
                a_calls_during = answered[0] - before
            call_alone = statistics.median(_call(b, "alone") for _ in range(b_calls))
            big = a.batches.create(
                input_file_id=a_file, endpoint="/v1/chat/completions", completion_window="24h"
            ).id
            time.sleep(head_start)
            call_shared = statistics.median(_call(b, "beside") for _ in range(b_calls))
            a_running = _done(a, big)[1] == "in_progress"
            with suppress(openai.ConflictError):  # finished meanwhile: nothing to stop
                a.batches.cancel(big)
            rows.append(
                {
                    "b_batch_alone_s": alone_s,
                    "b_batch_beside_calls_s": shared_s,
                    "a_calls_during_b": a_calls_during,
                    "b_call_alone_s": call_alone,
                    "b_call_beside_batch_s": call_shared,
                    "a_batch_still_running": a_running,
                }
            )

    def median(key: str) -> float:
        return float(statistics.median(r[key] for r in rows))

    return {
        "calls": calls,
        "small": small,
        "large": large,
        "b_calls": b_calls,
        "max_concurrency": capacity,
        "rounds": rows,
        "b_batch_alone_s": median("b_batch_alone_s"),
        "b_batch_beside_calls_s": median("b_batch_beside_calls_s"),
        "batch_ratio": median("b_batch_beside_calls_s") / median("b_batch_alone_s"),
        "b_call_alone_s": median("b_call_alone_s"),
        "b_call_beside_batch_s": median("b_call_beside_batch_s"),
        "call_ratio": median("b_call_beside_batch_s") / median("b_call_alone_s"),
        "a_batch_still_running": all(r["a_batch_still_running"] for r in rows),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", type=int, default=20, help="tenant B's lines (default 20)")
    p.add_argument("--large", type=int, default=20000, help="tenant A's lines (default 20000)")
    p.add_argument("--a-batches", type=int, default=1, help="A's lines split into this many")
    p.add_argument("--repeats", type=int, default=3, help="rounds (default 3)")
    p.add_argument("--head-start", type=float, default=2.0, help="A's seconds before B's start")
    p.add_argument("--max-concurrency", type=int, default=64, help="the server's (default 64)")
    p.add_argument("--calls", type=int, default=0, help="A's calls in flight (the calls mode)")
    p.add_argument("--b-calls", type=int, default=20, help="B's calls per round (calls mode)")
    add_src_options(p)
    args = p.parse_args()
    use_src(args.src)
    if args.calls:
        figures = measure_calls(
            args.calls, args.small, args.large, args.b_calls, args.repeats, args.head_start,
            args.max_concurrency,
        )  # fmt: skip
        name = "server_fairness_calls"
    else:
        figures = measure(
            args.small, args.large, args.a_batches, args.repeats, args.head_start,
            args.max_concurrency,
        )  # fmt: skip
        name = "server_fairness" + (f"_{args.a_batches}" if args.a_batches > 1 else "")
    figures["target"] = (
        f"stub, 50 ms latency, {args.max_concurrency} in flight, two tenants; polled every 20 ms"
    )
    figures["server_src"] = "another checkout" if args.src else "this checkout"
    path = save(f"{name}_{args.label}" if args.src else name, figures)
    if args.calls:
        print(
            f"B's {args.small}-line batch: alone {figures['b_batch_alone_s']:.2f} s, beside A's "
            f"{args.calls} calls in flight {figures['b_batch_beside_calls_s']:.2f} s "
            f"(x{figures['batch_ratio']:.2f}); B's call: alone "
            f"{figures['b_call_alone_s'] * 1000:.0f} ms, beside A's {args.large}-line batch "
            f"{figures['b_call_beside_batch_s'] * 1000:.0f} ms (x{figures['call_ratio']:.2f})"
            f"\nwrote {path}"
        )
        return
    print(
        f"B's {args.small} lines: alone {figures['b_alone_s']:.2f} s, while A's {args.large} "
        f"lines in {args.a_batches} batch(es) run {figures['b_with_large_s']:.2f} s "
        f"(x{figures['ratio']:.2f}); A finished "
        f"{figures['a_lines_during_b']:.0f} lines meanwhile; B done before A: "
        f"{figures['b_finished_before_a']}\nwrote {path}"
    )


if __name__ == "__main__":
    main()
