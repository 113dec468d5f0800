"""A batch through ``batchclient serve`` / the same file through ``batchclient run`` (goal: the
server's throughput at least 0.95 of run's).

Same provider for both: the stub server in its own process, 50 ms latency, 64 in flight. Each
run times what a user waits for, from the input file on disk to the output file on disk:

- ``run``: ``batchclient run IN -o OUT --no-progress`` in a fresh process, timed inside it
  around ``main()`` (the interpreter's start-up and the imports are not counted): it uploads the
  file into its state directory, runs the batch, polls it every 0.25 s and writes the output;
- ``server``: a ``batchclient serve`` process started beforehand (the usual case: one server,
  many batches); the openai SDK uploads the file (``files.create``), creates the batch, polls it
  every 0.25 s (as ``run`` does) and downloads the output file (``files.content``);
- ``fresh_server``: the same against a server started for that batch alone (its start is not
  timed), so its provider starts cold as ``run``'s does: no open connections yet, the adaptive
  in-flight limit slow-starting from 16. The warm server skips that ramp, which is most of why
  it is faster than ``run``; the fresh one isolates what HTTP and the server process cost.

In turn (the order reversed every other round), ``--repeats`` times each; ratios of medians.
Also recorded: the CPU seconds each spends per batch (``run``'s process around ``main()``; the
server process and the SDK client during the batch), which a busy machine does not distort the
way it does wall times.

    python bench/server_throughput.py [--n 1000] [--repeats 7]

Writes bench/results/server_throughput.json.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai
import psutil

from _jobs_common import child_env, save, stub_process, write_input
from _server_common import run_batch, serve

POLL_S = 0.25  # what `batchclient run` polls at
MODES = ("run", "server", "fresh_server")
SERVE_ARGS = ("--max-concurrency", "64")
_RUN = """
import resource, sys, time
from batchclient.cli import main
import batchclient.cli._run, batchclient.remote  # imported before the clock starts
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
started, cpu_started = time.perf_counter(), cpu()
code = main(sys.argv[1:])
print(time.perf_counter() - started, cpu() - cpu_started)
sys.exit(code)
"""


def time_run(stub: str, inp: Path, tmp: Path, r: int) -> tuple[float, float]:
    """Wall and CPU seconds of ``batchclient run`` (inside its process, around ``main()``)."""
    out, state = tmp / f"run-{r}.jsonl", tmp / f"run-state-{r}"
    args = ["run", str(inp), "-o", str(out), "--base-url", stub, "--state-dir", str(state),
            "--max-concurrency", "64", "--no-progress"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", _RUN, *args], env=child_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    wall, cpu = done.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def time_server(
    client: openai.OpenAI, server: psutil.Process, inp: Path, out: Path, n: int
) -> tuple[float, float]:
    """Wall seconds the SDK client waits, and CPU seconds the server process and this one (the
    SDK client) spend."""
    cpu_started = _cpu(server) + _own_cpu()
    started = time.perf_counter()
    out.write_bytes(run_batch(client, inp, n, POLL_S))
    took = time.perf_counter() - started
    return took, _cpu(server) + _own_cpu() - cpu_started


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def measure(n: int, repeats: int) -> dict[str, Any]:
    wall: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as name, stub_process(latency_s=0.05) as stub:
        tmp = Path(name)
        inp = write_input(tmp / "in.jsonl", n, max_tokens=8)
        with serve(stub, tmp / "serve-state", *SERVE_ARGS) as (url, proc):
            warm = psutil.Process(proc.pid)
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
            client.chat.completions.create(  # warm-up: connections, model check
                model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=1
            )
            for r in range(repeats):
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    out = tmp / f"{mode}-{r}.jsonl"
                    if mode == "run":
                        took, used = time_run(stub, inp, tmp, r)
                    elif mode == "server":
                        took, used = time_server(client, warm, inp, out, n)
                    else:  # a server started for this batch alone: its provider is cold too
                        with serve(stub, tmp / f"fresh-{r}", *SERVE_ARGS) as (fresh_url, fresh):
                            fresh_client = openai.OpenAI(
                                base_url=f"{fresh_url}/v1", api_key="none", max_retries=0
                            )
                            took, used = time_server(
                                fresh_client, psutil.Process(fresh.pid), inp, out, n
                            )
                    wall[mode].append(took)
                    cpu[mode].append(used)
    median = {mode: statistics.median(wall[mode]) for mode in MODES}
    return {
        "n": n,
        "wall_s": wall,
        "cpu_s": cpu,
        "requests_per_s": {mode: n / median[mode] for mode in MODES},
        "ratio_server_over_run": median["run"] / median["server"],
        "ratio_fresh_server_over_run": median["run"] / median["fresh_server"],
        "cpu_per_batch_s": {mode: statistics.median(cpu[mode]) for mode in MODES},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1000, help="request lines (default 1000)")
    p.add_argument("--repeats", type=int, default=7, help="runs of each (default 7)")
    args = p.parse_args()
    figures = measure(args.n, args.repeats)
    figures["target"] = "stub, 50 ms latency, 64 in flight; polled every 0.25 s"
    worst = min(figures["ratio_server_over_run"], figures["ratio_fresh_server_over_run"])
    figures["goal_at_least_0_95"] = worst >= 0.95
    path = save("server_throughput", figures)
    rate, used = figures["requests_per_s"], figures["cpu_per_batch_s"]
    print(
        f"{args.n} lines, stub 50 ms, 64 in flight, medians of {args.repeats}: batchclient run "
        f"{rate['run']:.0f} req/s; server {rate['server']:.0f} req/s (ratio "
        f"{figures['ratio_server_over_run']:.3f}); a server started for the batch "
        f"{rate['fresh_server']:.0f} req/s (ratio {figures['ratio_fresh_server_over_run']:.3f}); "
        f"goal >= 0.95: {figures['goal_at_least_0_95']}. CPU per batch: run {used['run']:.2f} s, "
        f"server + SDK client {used['server']:.2f} s\nwrote {path}"
    )


if __name__ == "__main__":
    main()
