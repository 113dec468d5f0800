"""The result cache, merged identical lines and dry runs, measured.

1. A finished N-line batch run again with the cache (a new batch over the same requests, both
   with ``cache=True``): requests sent the second time (target 0) and its wall time over the
   first run's (target <= 5 %). Wall time = upload + ``batches.create`` .. ``wait`` + export to
   an output file, as ``batchclient run`` does.
2. N lines with 10 distinct greedy bodies, cache off: requests sent (target 10).
3. ``batchclient run FILE --dry-run`` on a 50,000-line file of ShareGPT first turns: wall time
   and peak RSS of the process, with the estimate and with the bundled model's tokenizer.

Targets: the stub in its own process (50 ms per answer, as ``bench/jobs_throughput.py``), and
with ``--real`` also the real vLLM server with the bundled model (started here:
``python bench/cache.py --real``) or ``--base-url URL``.

    python bench/cache.py [--n 1000] [--dry-run-lines 50000] [--parts stub dry-run real]
    python bench/cache.py --parts real   # starts the vLLM server

Writes bench/results/cache.json (parts not run this time are kept from the file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

from _jobs_common import RESULTS, child_env, save, stub_process
from batchclient import RemoteBatchInference
from batchclient.models import bundled_model_path


def request_lines(n: int, distinct: int | None = None, max_tokens: int = 16) -> bytes:
    lines = []
    for i in range(n):
        k = i if distinct is None else i % distinct
        body = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": f"Request number {k}: say something."}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
        lines.append(json.dumps({**line, "body": body}))
    return ("\n".join(lines) + "\n").encode()


class Counter:
    """Chat requests a target received: the stub's ``/stats`` or a counting proxy."""

    def __init__(self, url: str, proxy: Any = None) -> None:
        self.url, self.proxy = url, proxy

    def requests(self) -> int:
        if self.proxy is not None:
            return int(self.proxy.requests)
        root = self.url.removesuffix("/v1")
        return int(
            json.loads(urllib.request.urlopen(f"{root}/stats", timeout=10).read())["requests"]
        )


async def timed_batch(c: RemoteBatchInference, data: bytes, out: Path) -> tuple[float, Any]:
    started = time.perf_counter()
    record = await c.files.create(data)
    batch = await c.batches.create(record.id)
    done = await c.batches.wait(batch.id)
    await c.batches.export(batch.id, out)
    return time.perf_counter() - started, done


async def rerun_figures(url: str, counter: Counter, n: int, tmp: Path) -> dict[str, Any]:
    state = tmp / f"state-rerun-{time.monotonic_ns()}"
    data = request_lines(n)
    async with RemoteBatchInference(url, max_concurrency=64, state_dir=state, cache=True) as c:
        before = counter.requests()
        first_s, first = await timed_batch(c, data, tmp / "first.jsonl")
        mid = counter.requests()
        second_s, second = await timed_batch(c, data, tmp / "second.jsonl")
        after = counter.requests()
    return {
        "n": n,
        "first_run_s": round(first_s, 3),
        "first_run_requests_sent": mid - before,
        "second_run_s": round(second_s, 3),
        "second_run_requests_sent": after - mid,
        "second_run_cache_hits": second.cache_hits,
        "second_over_first": round(second_s / first_s, 4),
        "targets": {"requests_sent": 0, "second_over_first_max": 0.05},
        "met": after - mid == 0 and second_s / first_s <= 0.05,
        "statuses": [first.status, second.status],
    }


async def merge_figures(url: str, counter: Counter, n: int, tmp: Path) -> dict[str, Any]:
    state = tmp / f"state-merge-{time.monotonic_ns()}"
    async with RemoteBatchInference(url, max_concurrency=64, state_dir=state) as c:
        before = counter.requests()
        wall_s, done = await timed_batch(c, request_lines(n, distinct=10), tmp / "merged.jsonl")
        sent = counter.requests() - before
    return {
        "n": n,
        "distinct_bodies": 10,
        "requests_sent": sent,
        "completed": done.request_counts.completed,
        "wall_s": round(wall_s, 3),
        "target": 10,
        "met": sent == 10 and done.request_counts.completed == n,
    }


def sharegpt_file(path: Path, n: int) -> Path:
    """``n`` request lines of ShareGPT first human turns, all distinct (past the end of the
    dataset's prompts they come round again with a numbered suffix)."""
    from batchclient.datasets import _load_pairs, _package_file  # the file is cut short

    source = _package_file()
    st = source.stat()
    pairs = _load_pairs(str(source.resolve()), st.st_size, st.st_mtime_ns)
    prompts = [prompt[:6000] for _, prompt, _ in pairs if prompt]
    with path.open("w") as f:
        for i in range(n):
            text = prompts[i % len(prompts)]
            if i >= len(prompts):
                text += f"\n\n(variant {i // len(prompts)})"
            body = {
                "model": "smollm2",
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 256,
                "temperature": 0,
            }
            line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
            f.write(json.dumps({**line, "body": body}) + "\n")
    return path


_MEASURE = """
import resource, subprocess, sys, time
started = time.perf_counter()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
wall = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(wall, peak, proc.returncode)
print(proc.stdout, end="")
"""


def measure_cli(args: list[str]) -> dict[str, Any]:
    """Wall time and peak RSS (ru_maxrss of the only child, KiB) of one command."""
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, *args], capture_output=True, text=True, env=child_env()
    )
    head, *report = out.stdout.splitlines()
    wall, peak, rc = head.split()
    return {
        "wall_s": round(float(wall), 2),
        "peak_rss_mib": round(int(peak) / 1024, 1),
        "exit_status": int(rc),
        "report": report,
    }


def dry_run_figures(url: str, lines: int, tmp: Path) -> dict[str, Any]:
    big = sharegpt_file(tmp / "big.jsonl", lines)
    cli = [sys.executable, "-m", "batchclient.cli", "run", str(big), "--dry-run"]
    cli += ["--base-url", url, "--state-dir", str(tmp / "state-dry")]
    cli += ["--price-input", "0.15", "--price-output", "0.60"]
    return {
        "lines": lines,
        "file_mib": round(big.stat().st_size / 2**20, 1),
        "estimate": measure_cli(cli),
        "tokenizer": measure_cli([*cli, "--tokenizer", str(bundled_model_path())]),
    }


@contextlib.contextmanager
def real_server(base_url: str | None) -> Iterator[str]:
    if base_url is not None:
        yield base_url
        return
    from batchclient.testing import vllm_server

    with vllm_server(max_model_len=2048) as url:
        yield url


def run_target(url: str, counter: Counter, n: int, tmp: Path) -> dict[str, Any]:
    return {
        "rerun_with_cache": anyio.run(rerun_figures, url, counter, n, tmp),
        "merged_lines": anyio.run(merge_figures, url, counter, n, tmp),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--dry-run-lines", type=int, default=50_000)
    parser.add_argument(
        "--parts", nargs="+", choices=("stub", "dry-run", "real"), default=["stub", "dry-run"]
    )
    parser.add_argument("--base-url", default=None, help="real: a running server instead")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with stub_process(latency_s=0.05) as url:
            if "stub" in args.parts:
                results["stub_50ms"] = run_target(url, Counter(url), args.n, tmp)
            if "dry-run" in args.parts:
                results["dry_run"] = dry_run_figures(url, args.dry_run_lines, tmp)
        if "real" in args.parts:
            from batchclient.testing import CountingProxy

            with real_server(args.base_url) as upstream, CountingProxy(upstream) as proxy:
                results["vllm_server"] = run_target(
                    proxy.url, Counter(proxy.url, proxy), args.n, tmp
                )
    print(json.dumps(results, indent=2))
    previous = RESULTS / "cache.json"  # read now: another part may have run meanwhile
    merged: dict[str, Any] = json.loads(previous.read_text()) if previous.exists() else {}
    for key in ("benchmark", "when", "machine"):
        merged.pop(key, None)
    merged.update(results, note="one run per part on a shared, busy 2-core machine")
    print(f"wrote {save('cache', merged)}")


if __name__ == "__main__":
    main()
