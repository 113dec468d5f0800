"""``BatchAPIBatchInference`` through each OpenAI-shaped flavour's stub: creates, bytes, time, RSS.

For each flavour (``openai``, ``together``, ``groq``, ``mistral``) the Batch API stub speaks that
provider's shape (``BatchAPIStub(flavor=...)``, in this process) and a fresh child process makes
one ``batch_chat_completion`` of N conversations (default 10,000; 40-word prompts,
``max_tokens`` 16) with ``poll_interval_s`` 0.1 s:

- ``creates`` / ``uploads`` / ``bytes_uploaded``: what the stub received;
- ``total_s``: the child's whole call (write, upload, create, the stub answering every line,
  polls, download, decode); the stub answers at once, so this is the client's own cost plus at
  most one polling interval per remote batch; ``peak_rss_mib``: the child's peak RSS
  (``ru_maxrss``, process start-up included);
- ``kill_reattach``: the same call in a child that is SIGKILLed once its remote batch exists
  (the stub answering 1 ms per line so it is still running), then made again by a new child
  on the same state directory: ``creates`` counts every remote batch created (target 1: the
  second child re-attaches instead of creating), ``items_ok`` the items the second child got.

Usage: ``python bench/batch_api_flavors.py [-n 10000] [--kill-n 2000]
[--out bench/results/batch_api_flavors.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from batchclient.testing import BatchAPIStub

FLAVORS = ["openai", "together", "groq", "mistral"]


def child(flavor: str, url: str, state: str, n: int = 10_000) -> None:
    """One call of ``n`` conversations; prints JSON figures."""
    import resource

    import anyio

    from batchclient import BatchAPIBatchInference, SamplingParams

    async def run() -> dict[str, Any]:
        conversations = [
            [{"role": "user", "content": f"Question {i}: " + " ".join(f"w{j}" for j in range(40))}]
            for i in range(n)
        ]
        started = time.perf_counter()
        options: dict[str, Any] = {"flavor": flavor}  # a flavour name from the command line
        async with BatchAPIBatchInference(
            url, poll_interval_s=0.1, state_dir=state, **options
        ) as client:
            result = await client.batch_chat_completion(
                "smollm2", conversations, sampling_params=SamplingParams(max_tokens=16)
            )
        ok = sum(item.error is None for item in result.batch)
        return {"total_s": round(time.perf_counter() - started, 2), "items_ok": ok}

    figures = anyio.run(run)
    figures["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(figures))


def spawn(flavor: str, url: str, state: Path, n: int) -> subprocess.Popen[str]:
    cmd = [sys.executable, __file__, "--child", flavor, url, str(state), "-n", str(n)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def one(flavor: str, n: int) -> dict[str, Any]:
    with BatchAPIStub(flavor=flavor) as stub, tempfile.TemporaryDirectory() as tmp:
        proc = spawn(flavor, stub.url, Path(tmp), n)
        out, _ = proc.communicate(timeout=600)
        figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        uploaded = [f for f in stub.files.values() if f.get("purpose") != "batch_output"]
        figures.update(
            creates=stub.stats.creates,
            uploads=stub.stats.uploads,
            bytes_uploaded=sum(int(f.get("bytes", 0)) for f in uploaded),
        )
    return figures


def kill_reattach(flavor: str, n: int) -> dict[str, Any]:
    with (
        BatchAPIStub(flavor=flavor, line_delay_s=0.001) as stub,
        tempfile.TemporaryDirectory() as tmp,
    ):
        first = spawn(flavor, stub.url, Path(tmp), n)
        deadline = time.monotonic() + 120
        while stub.stats.creates < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the create's answer recorded, the batch running
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        second = spawn(flavor, stub.url, Path(tmp), n)
        out, _ = second.communicate(timeout=600)
        figures = json.loads(out.strip().splitlines()[-1])
        return {"creates": stub.stats.creates, "items_ok": figures["items_ok"], "n": n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=10_000, help="conversations (default 10000)")
    p.add_argument("--kill-n", type=int, default=2_000, help="conversations in the kill run")
    p.add_argument("--out", type=Path, default=Path("bench/results/batch_api_flavors.json"))
    p.add_argument("--child", nargs=3, metavar=("FLAVOR", "URL", "STATE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.child[2], args.n)
        return
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load": os.getloadavg()[0]},
        "n": args.n,
    }  # fmt: skip
    for flavor in FLAVORS:
        results[flavor] = {
            "call": one(flavor, args.n),
            "kill_reattach": kill_reattach(flavor, args.kill_n),
        }
        print(flavor, json.dumps(results[flavor]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
