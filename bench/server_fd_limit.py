"""300 idle sockets against ``batchclient serve`` under a low open-files limit (``prlimit
--nofile=256``, as in many containers): do keyed requests still get answers, and how much does
the server log?

The server (one key, the stub as upstream) is started under ``prlimit``; 300 sockets connect
and send nothing; 10 keyed ``GET /v1/models`` follow (5 s timeout each); after 20 s the log's
size is read. The server's peak file-descriptor count is sampled from ``/proc`` while the
sockets connect.

    python bench/server_fd_limit.py [--nofile 256] [--sockets 300] [--src DIR]

``--src`` runs another checkout's ``src`` (to compare with a version before a change). Writes
bench/results/server_fd_limit.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from _jobs_common import save
from batchclient.testing import StubServer, free_port

KEY = "bench-key-0123456789"
SRC = Path(__file__).resolve().parents[1] / "src"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nofile", type=int, default=256)
    p.add_argument("--sockets", type=int, default=300)
    p.add_argument("--src", default=str(SRC))
    args = p.parse_args()
    with StubServer() as stub, tempfile.TemporaryDirectory() as d:
        port = free_port()
        log_path = Path(d) / "serve.log"
        log = log_path.open("wb")
        cmd = ["prlimit", f"--nofile={args.nofile}:{args.nofile}", sys.executable, "-m",
               "batchclient.cli", "serve", "--base-url", stub.url, "--port", str(port),
               "--state-dir", f"{d}/state", "--api-key", KEY]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": args.src}
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
        url = f"http://127.0.0.1:{port}"
        auth = {"Authorization": f"Bearer {KEY}"}
        try:
            for _ in range(600):
                try:
                    httpx.get(f"{url}/v1/models", headers=auth, timeout=2)
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            fds = Path(f"/proc/{proc.pid}/fd")
            peak = [len(os.listdir(fds))]
            stop = threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    with contextlib.suppress(OSError):
                        peak.append(len(os.listdir(fds)))
                    time.sleep(0.02)

            sampler = threading.Thread(target=sample)
            sampler.start()
            started = time.monotonic()
            socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(args.sockets)]
            time.sleep(0.5)
            stop.set()
            sampler.join()
            latencies, answered = [], 0
            for _ in range(10):
                t = time.monotonic()
                try:
                    r = httpx.get(f"{url}/v1/models", headers=auth, timeout=5)
                    answered += r.status_code == 200
                except httpx.HTTPError:
                    pass
                latencies.append(time.monotonic() - t)
            time.sleep(max(0.0, 20 - (time.monotonic() - started)))
            figures = {
                "src": "this checkout" if args.src == str(SRC) else "another checkout",
                "nofile": args.nofile,
                "sockets": args.sockets,
                "keyed_answered_of_10": answered,
                "keyed_max_s": round(max(latencies), 2),
                "peak_fds": max(peak),
                "log_bytes_after_20s": log_path.stat().st_size,
            }
            for s in socks:
                s.close()
        finally:
            proc.terminate()
            proc.wait(20)
    print(figures)
    print(f"wrote {save('server_fd_limit', figures)}")


if __name__ == "__main__":
    main()
