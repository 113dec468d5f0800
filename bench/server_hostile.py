"""``batchclient serve`` under hostile clients, over real loopback sockets (stub backend):

- ``fields``: one chunked ``POST /v1/files`` with 1,700 non-file fields of 60 KB each against a
  server started with ``--max-upload-mib 1``; the server's peak RSS over idle (psutil, every
  5 ms) and the answer's status.
- ``idle``: 300 sockets that connect and send nothing, then 20 keyed ``GET /v1/models`` one
  after another (5 s timeout each): how many answered, their median latency, how many idle
  sockets the server still holds after ``--hold`` seconds, the server log's growth, the RSS.
- ``slow_head``: a request head sent at 1 byte per second: seconds until the server closes.
- ``slow_body``: a JSON body sent at 1 byte per second: seconds until the server answers or
  closes.
- ``lying_length``: ``POST /v1/files`` declaring ``Content-Length: 1000000`` that sends 200
  bytes and then nothing: seconds until the server answers or closes.

Each "held" figure stops at ``--hold`` seconds (a server that never lets go reads as that).

    python bench/server_hostile.py [--hold 40] [serve options...]

Writes bench/results/server_hostile.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from _jobs_common import save, stub_process
from _server_common import PeakRss, start_serve

KEY = "bench-key-0123456789"
BOUNDARY = b"hostile-boundary"


def rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


async def _status(reader: asyncio.StreamReader, limit: float) -> tuple[str, float]:
    """The status line of the answer (or "closed"), and when it came."""
    started = time.monotonic()
    try:
        line = await asyncio.wait_for(reader.readline(), limit)
    except TimeoutError:
        return "held", limit
    return (line.decode().split(" ")[1] if line else "closed"), time.monotonic() - started


async def fields_attack(host: str, port: int) -> str:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode()
        + b"\r\nTransfer-Encoding: chunked\r\nContent-Type: multipart/form-data; boundary="
        + BOUNDARY + b"\r\n\r\n"
    )  # fmt: skip
    value = b"v" * 60_000
    try:
        for i in range(1700):
            part = (
                b"--" + BOUNDARY + b'\r\nContent-Disposition: form-data; name="f%d"\r\n\r\n' % i
                + value + b"\r\n"
            )  # fmt: skip
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
        end = b"--" + BOUNDARY + b"--\r\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(end), end))
        await writer.drain()
    except ConnectionError:
        pass
    status, _ = await _status(reader, 60)
    writer.close()
    return status


async def idle_sockets(host: str, port: int, n: int, hold: float) -> dict[str, Any]:
    socks = [await asyncio.open_connection(host, port) for _ in range(n)]
    latencies: list[float] = []
    answered = 0
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=5) as client:
        for _ in range(20):
            started = time.monotonic()
            try:
                r = await client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
                answered += r.status_code == 200
                latencies.append(time.monotonic() - started)
            except httpx.HTTPError:
                latencies.append(5.0)
            await asyncio.sleep(0.05)
    await asyncio.sleep(max(0.0, hold - 2))
    open_after = 0
    for reader, writer in socks:
        try:
            data = await asyncio.wait_for(reader.read(1), 0.01)
            open_after += data != b""
        except TimeoutError:
            open_after += 1
        except ConnectionError:
            pass
        writer.close()
    return {
        "sockets": n,
        "keyed_answered_of_20": answered,
        "keyed_median_ms": statistics.median(latencies) * 1000,
        "keyed_max_ms": max(latencies) * 1000,
        f"idle_still_open_after_{hold:.0f}s": open_after,
    }


async def trickle(host: str, port: int, head: bytes, body: bytes, hold: float) -> dict[str, Any]:
    """Send ``head`` at once then ``body`` one byte a second (or, with an empty body, ``head``
    one byte a second)."""
    reader, writer = await asyncio.open_connection(host, port)
    slow = body or head
    if body:
        writer.write(head)
    started = time.monotonic()
    answer: asyncio.Task[tuple[str, float]] = asyncio.create_task(_status(reader, hold))
    for byte in slow:
        if answer.done():
            break
        try:
            writer.write(bytes([byte]))
            await writer.drain()
        except ConnectionError:
            break
        await asyncio.wait([answer], timeout=1.0)
        if time.monotonic() - started > hold:
            break
    status, _ = await answer
    writer.close()
    return {"status": status, "held_s": round(time.monotonic() - started, 1)}


async def lying_length(host: str, port: int, hold: float) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode()
        + b"\r\nContent-Length: 1000000\r\nContent-Type: multipart/form-data; boundary="
        + BOUNDARY + b"\r\n\r\n--" + BOUNDARY
        + b'\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n' + b"x" * 200
    )  # fmt: skip
    status, took = await _status(reader, hold)
    writer.close()
    return {"status": status, "held_s": round(took, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hold", type=float, default=40.0, help="longest wait per attack, s")
    p.add_argument("--sockets", type=int, default=300)
    args, extra = p.parse_known_args()
    figures: dict[str, Any] = {"serve_options": extra}
    host = "127.0.0.1"
    with tempfile.TemporaryDirectory() as name, stub_process() as stub:
        tmp = Path(name)
        log = tmp / "serve.log"
        url, proc = start_serve(stub, tmp / "state", "--api-key", KEY, "--max-upload-mib", "1",
                                "--log-level", "info", *extra, log=log)  # fmt: skip
        port = int(url.rsplit(":", 1)[1])
        try:
            httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
            time.sleep(1.0)
            idle = max(rss(proc.pid) for _ in range(10))
            with PeakRss(proc.pid) as peak:
                status = asyncio.run(fields_attack(host, port))
                time.sleep(0.5)
            figures["fields"] = {
                "status": status,
                "idle_rss_mb": round(idle / 2**20, 1),
                "peak_over_idle_mib": round((peak.peak - idle) / 2**20, 1),
            }
            print("fields", figures["fields"], flush=True)
            log_before = log.stat().st_size
            with PeakRss(proc.pid) as peak:
                before = rss(proc.pid)
                figures["idle"] = asyncio.run(idle_sockets(host, port, args.sockets, args.hold))
            figures["idle"]["peak_over_before_mib"] = round((peak.peak - before) / 2**20, 1)
            figures["idle"]["log_growth_bytes"] = log.stat().st_size - log_before
            print("idle", figures["idle"], flush=True)
            head = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
            figures["slow_head"] = asyncio.run(trickle(host, port, head, b"", args.hold))
            print("slow_head", figures["slow_head"], flush=True)
            body = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"a" * 200
            json_head = (
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                + KEY.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % (len(body) + 10)
            )  # fmt: skip
            figures["slow_body"] = asyncio.run(trickle(host, port, json_head, body, args.hold))
            print("slow_body", figures["slow_body"], flush=True)
            figures["lying_length"] = asyncio.run(lying_length(host, port, args.hold))
            print("lying_length", figures["lying_length"], flush=True)
            figures["server_alive"] = proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(20)
    path = save("server_hostile", figures)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
