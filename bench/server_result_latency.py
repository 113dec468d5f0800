"""Other tenants' latency, and the server's RSS, while one tenant fetches the original
protocol's result of a 50,001-line batch (``GET /batch-inference/jobs/{id}/result``; goal: under
100 ms added to the other tenants' median).

``batchclient serve`` runs as its own process with two keys (two tenants) over the stub. Tenant
A's 50,001-line batch is run once into ``--state`` (kept between runs, so the same batch serves
a before/after comparison with ``--src``). Tenant B then calls ``GET /v1/batches`` back to back,
alone for ``--idle-s`` seconds and again while tenant A fetches the result ``--fetches`` times
at once (the server's RSS sampled every 5 ms meanwhile). The fetched documents are checked: one
item per line, in order.

    python bench/server_result_latency.py [--lines 50001] [--fetches 3] [--src DIR]

Writes bench/results/server_result_latency.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

import _jobs_common
from _jobs_common import save, stub_process, write_input
from _server_common import serve

KEY_A = "key-a-0123456789abcdef"
KEY_B = "key-b-fedcba9876543210"


def prepare(url: str, state: Path, lines: int) -> str:
    """Tenant A's finished batch of ``lines`` lines (run once per state directory)."""
    marker = state / "bench_batch_id"
    if marker.exists():
        return marker.read_text()
    a = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=600)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_input(Path(tmp) / "in.jsonl", lines, max_tokens=4)
        with path.open("rb") as f:
            up = a.post("/v1/files", files={"file": f}, data={"purpose": "batch"})
    up.raise_for_status()
    batch = a.post(
        "/v1/batches",
        json={"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions",
              "completion_window": "24h"},
    ).json()  # fmt: skip
    while batch["status"] not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(1)
        batch = a.get(f"/v1/batches/{batch['id']}").json()
    assert batch["status"] == "completed", batch
    marker.write_text(batch["id"])
    return str(batch["id"])


def other_tenant(url: str, seconds: float) -> list[float]:
    """Tenant B's ``GET /v1/batches`` latencies (ms), back to back for ``seconds``."""
    b = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY_B}"}, timeout=60)
    out: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        b.get("/v1/batches").raise_for_status()
        out.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.01)
    return out


def summary(ms: list[float]) -> dict[str, float]:
    ms = sorted(ms)
    return {
        "n": len(ms),
        "median_ms": round(statistics.median(ms), 1),
        "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 1),
        "max_ms": round(ms[-1], 1),
    }


def run(url: str, pid: int, batch_id: str, lines: int, fetches: int, idle_s: float) -> Any:
    proc = psutil.Process(pid)
    idle = other_tenant(url, idle_s)
    rss_idle = proc.memory_info().rss
    peak = [rss_idle]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.005)

    fetch_s: list[float] = []

    def fetch() -> None:
        a = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=600)
        t0 = time.perf_counter()
        got = a.get(f"/batch-inference/jobs/{batch_id}/result")
        got.raise_for_status()
        items = got.json()["batch"]
        fetch_s.append(time.perf_counter() - t0)
        assert len(items) == lines and items[-1]["custom_id"] == f"r{lines - 1}"

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    busy: list[float] = []
    fetchers = [threading.Thread(target=fetch) for _ in range(fetches)]
    tenant_b = threading.Thread(target=lambda: busy.extend(other_tenant(url, 0.2)))
    for t in fetchers:
        t.start()
    # tenant B keeps calling for as long as any fetch is running
    while any(t.is_alive() for t in fetchers):
        tenant_b = threading.Thread(target=lambda: busy.extend(other_tenant(url, 0.2)))
        tenant_b.start()
        tenant_b.join()
    for t in fetchers:
        t.join()
    stop.set()
    sampler.join()
    assert len(fetch_s) == fetches, "a fetch failed"
    idle_s_ = summary(idle)
    busy_s = summary(busy)
    return {
        "other_tenant_idle": idle_s_,
        "other_tenant_while_fetching": busy_s,
        "median_added_ms": round(busy_s["median_ms"] - idle_s_["median_ms"], 1),
        "fetch_s": [round(s, 2) for s in fetch_s],
        "server_rss_idle_mib": round(rss_idle / 2**20, 1),
        "server_rss_peak_added_mib": round((peak[0] - rss_idle) / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50_001)
    parser.add_argument("--fetches", type=int, default=3)
    parser.add_argument("--idle-s", type=float, default=2.0)
    parser.add_argument("--state", type=Path, default=Path(tempfile.gettempdir()) / "bc-result")
    parser.add_argument("--src", type=Path, default=None, help="batchclient sources to serve")
    parser.add_argument("--name", default="server_result_latency")
    args = parser.parse_args()
    if args.src is not None:
        _jobs_common.SRC = args.src.resolve()
    args.state.mkdir(parents=True, exist_ok=True)
    with (
        stub_process() as stub,
        serve(stub, args.state, "--api-key", KEY_A, "--api-key", KEY_B) as (url, proc),
    ):
        batch_id = prepare(url, args.state, args.lines)
        figures = run(url, proc.pid, batch_id, args.lines, args.fetches, args.idle_s)
    src = "another checkout" if args.src else "this checkout"
    figures = {"lines": args.lines, "fetches_at_once": args.fetches, "src": src, **figures}
    print(json.dumps(figures, indent=2))
    print(save(args.name, figures))


if __name__ == "__main__":
    main()
