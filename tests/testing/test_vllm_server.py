"""The real vLLM OpenAI server as a context manager: start, serve, stop without leftovers."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from batchclient.errors import EndpointError
from batchclient.testing import free_port, vllm_server

pytestmark = pytest.mark.server


def _live_procs() -> dict[int, tuple[int, bytes]]:
    """pid -> (process group, command line) of every non-zombie process."""
    out: dict[int, tuple[int, bytes]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            out[int(stat.parent.name)] = (int(fields[2]), cmdline)
    return out


def _server_group(port: int) -> int:
    (pgid,) = {
        pgid
        for pgid, cmd in _live_procs().values()
        if b"vllm.entrypoints.openai.api_server" in cmd and f"--port\0{port}\0".encode() in cmd
    }
    return pgid


@pytest.mark.heavy
def test_serves_the_bundled_model_and_leaves_nothing_behind() -> None:
    port = free_port()
    started = time.monotonic()
    with vllm_server(port=port) as base_url:
        startup_s = time.monotonic() - started
        assert base_url == f"http://127.0.0.1:{port}/v1"
        pgid = _server_group(port)
        members = [pid for pid, (group, _) in _live_procs().items() if group == pgid]
        assert len(members) >= 3  # API server, engine core, worker (and resource tracker)

        with httpx.Client(base_url=base_url, timeout=60) as http:
            listed = http.get("/models").json()
            assert [m["id"] for m in listed["data"]] == ["smollm2"]
            assert listed["data"][0]["max_model_len"] == 2048

            reply = http.post(
                "/chat/completions",
                json={
                    "model": "smollm2",
                    "messages": [{"role": "user", "content": "What is the capital of France?"}],
                    "max_tokens": 8,
                    "temperature": 0,
                },
            )
            assert reply.status_code == 200, reply.text
            body = reply.json()
        assert body["model"] == "smollm2"
        assert 0 < body["usage"]["completion_tokens"] <= 8
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
        # some text: which words depends on the CPU's bfloat16 kernels (greedy SmolLM2-135M said
        # "Paris" on one machine, "L'Étoile, la Mar" on one with AMX)
        assert body["choices"][0]["message"]["content"].strip()
    print(f"server start-up: {startup_s:.1f} s")

    left = {pid for pid, (group, _) in _live_procs().items() if group == pgid}
    assert not left, f"processes left in the server's group: {left}"


def test_bogus_model_fails_fast_with_the_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    bogus = tmp_path / "no-such-model"
    started = time.monotonic()
    with pytest.raises(EndpointError) as caught, vllm_server(bogus, log_path=log):
        pytest.fail("the server should not have started")
    assert time.monotonic() - started < 60
    message = str(caught.value)
    assert "exited with code" in message
    assert str(log) in message
    # The cause, up front, and the log's tail (the full traceback is longer than 40 lines).
    first_line = message.splitlines()[0]
    assert "HFValidationError" in first_line and str(bogus) in first_line
    assert 'File "' in message
    assert log.read_text().splitlines()[-1] in message
    assert not [cmd for _, cmd in _live_procs().values() if str(bogus).encode() in cmd]


def test_startup_timeout_kills_the_half_started_server(tmp_path: Path) -> None:
    port = free_port()
    started = time.monotonic()
    with (
        pytest.raises(EndpointError, match=r"did not answer GET .* within 2 s"),
        vllm_server(startup_timeout_s=2, log_path=tmp_path / "server.log", port=port),
    ):
        pytest.fail("the server should not have started")
    # far under the default 180 s start-up wait; on an idle machine about 2 s, but with engines
    # computing on every core the half-started server's stop took 72 s once (its grace, 15 s,
    # and the kill's waits, on a starved machine)
    assert time.monotonic() - started < 120
    assert not [cmd for _, cmd in _live_procs().values() if f"--port\0{port}\0".encode() in cmd]
