"""How long ``GET /metrics`` takes with many batches in the state database.

A state directory is filled with ``--batches`` batch records (mixed statuses, request counts
and tokens; written straight into the store, nothing is run), ``create_app`` serves it on
loopback with one key, and ``--scrapes`` scrapes are timed from the client (each reads every
tenant's totals from SQLite and encodes every series).

    python bench/server_metrics.py [--batches 1000] [--scrapes 50]

Writes bench/results/server_metrics.json.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from _jobs_common import save
from batchclient.jobs._store import Store
from batchclient.remote import RemoteProvider
from batchclient.server import create_app, tenant_id
from batchclient.testing import AppServer, StubServer
from batchclient.types import FileObject

KEY = "bench-key-0123456789abcdef"
STATUSES = ("completed", "completed", "completed", "failed", "cancelled", "expired")


def fill(state: Path, batches: int) -> None:
    store = Store(state / "tenants" / tenant_id(KEY))
    data = b'{"custom_id": "x"}\n'
    record = FileObject(id="file-bench", bytes=len(data), created_at=int(time.time()),
                        filename="in.jsonl", purpose="batch")  # fmt: skip
    store.file_path(record.id).write_bytes(data)
    store.add_file(record, hashlib.sha256(data).hexdigest())
    now = int(time.time())
    for i in range(batches):
        store.insert_job(
            {"id": f"batch_{i:06d}", "input_file_id": record.id, "endpoint": "/v1/chat/completions",
             "completion_window": "24h", "status": STATUSES[i % len(STATUSES)],
             "created_at": now - i, "total": 100, "completed": 90, "failed": 10,
             "input_tokens": 5000, "output_tokens": 7000, "identity": "{}"}
        )  # fmt: skip
    store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=1000)
    p.add_argument("--scrapes", type=int, default=50)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, StubServer() as stub:
        state = Path(tmp)
        fill(state, args.batches)
        app = create_app(RemoteProvider(stub.url), state_dir=state, api_keys=[KEY])
        with (
            AppServer(app) as url,
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}) as client,
        ):
            first = client.get("/metrics")
            expected = sum(s == "completed" for s in (STATUSES * args.batches)[: args.batches])
            assert f'status="completed",tenant="{tenant_id(KEY)}"}} {expected}.0' in first.text
            times = []
            for _ in range(args.scrapes):
                started = time.perf_counter()
                client.get("/metrics").raise_for_status()
                times.append(time.perf_counter() - started)
    result = {
        "batches": args.batches,
        "scrapes": args.scrapes,
        "median_ms": round(statistics.median(times) * 1000, 2),
        "p90_ms": round(sorted(times)[int(0.9 * len(times))] * 1000, 2),
        "bytes": len(first.content),
    }
    print(result)
    save("server_metrics", result)


if __name__ == "__main__":
    main()
