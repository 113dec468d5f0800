"""``batchclient bench`` and ``batchclient serve --provider vllm`` stopped by SIGTERM: each
exits within seconds and leaves no process of its tree behind (the vLLM server, engine core
processes and the benchmark's run children sit in sessions of their own, out of reach of a
signal to the command). Each test starts a real server or engine as a subprocess."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest

from batchclient.testing import free_port

pytestmark = [pytest.mark.engine, pytest.mark.server]

SRC = str(Path(__file__).parents[2] / "src")
EXIT_S = 15.0
"""How long the command may take to exit after SIGTERM."""


def command(tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """``batchclient ARGS`` in a session of its own (as a shell would start it), logging to a
    file in ``tmp_path``."""
    log = (tmp_path / "command.log").open("wb")
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1"}
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)  # the command's own default binding
    return subprocess.Popen(
        [sys.executable, "-m", "batchclient.cli", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def tree(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    try:
        return [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        return []


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the command exited early ({proc.returncode})"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def alive(procs: list[psutil.Process]) -> list[str]:
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {cmdline(p)[:120]}")
        except psutil.Error:
            pass
    return left


def sigterm_and_check(proc: subprocess.Popen[bytes], seen: list[psutil.Process]) -> float:
    """SIGTERM the command; return how long it took to exit; assert nothing of ``seen`` (its
    tree as collected before the signal) outlives it."""
    procs = list({p.pid: p for p in [*seen, *tree(proc)] if p.pid != proc.pid}.values())
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=EXIT_S + 30)
        took = time.monotonic() - started
        # orphans of a process killed at the very end (its resource tracker) go in a moment
        deadline = time.monotonic() + 3
        left = alive(procs)
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = alive(procs)
    finally:
        for p in procs:  # never leave anything behind for the next test
            with contextlib.suppress(psutil.Error):
                p.kill()
        proc.kill()
        proc.wait()
    assert not left, f"left behind: {left}"
    print(f"exited {took:.1f} s after SIGTERM")
    return took


@pytest.mark.heavy
def test_bench_stops_its_server_on_sigterm(tmp_path: Path) -> None:
    """SIGTERM while the harness's vLLM server (its own session) is starting its engine."""
    proc = command(
        tmp_path,
        "bench", "-n", "4", "--max-tokens", "8", "--modes", "remote", "--max-concurrency", "4",
        "--no-warmup", "--kv-cache-gib", "1", "--out", str(tmp_path), "--name", "sig",
    )  # fmt: skip
    seen: list[psutil.Process] = []

    def server_has_engine() -> bool:
        seen[:] = tree(proc)
        servers = [p for p in seen if "vllm.entrypoints.openai.api_server" in cmdline(p)]
        return any(s.children() for s in servers)

    try:
        wait_for(server_has_engine, proc, 240)
    except BaseException:
        sigterm_and_check(proc, seen)
        raise
    took = sigterm_and_check(proc, seen)
    assert proc.returncode == 130
    assert took < EXIT_S, took


@pytest.mark.heavy
def test_bench_stops_its_engine_run_on_sigterm(tmp_path: Path) -> None:
    """SIGTERM while an engine mode's run child (its own session) runs its engine."""
    proc = command(
        tmp_path,
        "bench", "-n", "4", "--max-tokens", "8", "--modes", "inline", "--no-warmup",
        "--kv-cache-gib", "1", "--out", str(tmp_path), "--name", "sig",
    )  # fmt: skip
    seen: list[psutil.Process] = []

    def child_has_engine() -> bool:
        seen[:] = tree(proc)
        children = [p for p in seen if "batchclient.cli._bench._child" in cmdline(p)]
        return any(len(c.children(recursive=True)) >= 2 for c in children)  # core + worker

    try:
        wait_for(child_has_engine, proc, 240)
    except BaseException:
        sigterm_and_check(proc, seen)
        raise
    took = sigterm_and_check(proc, seen)
    assert proc.returncode == 130
    assert took < EXIT_S, took


@pytest.mark.heavy
def test_serve_with_an_engine_stops_within_10_s_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    proc = command(
        tmp_path,
        "serve", "--provider", "vllm", "--port", str(port), "--state-dir", str(tmp_path / "s"),
        "--engine-arg", f"kv_cache_memory_bytes={256 << 20}",
    )  # fmt: skip
    seen: list[psutil.Process] = []

    def answers() -> bool:
        seen[:] = tree(proc)
        try:
            return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).is_success
        except httpx.TransportError:
            return False

    try:
        wait_for(answers, proc, 240)
    except BaseException:
        sigterm_and_check(proc, seen)
        raise
    assert len(seen) >= 3  # the command, the engine core and its worker
    took = sigterm_and_check(proc, seen)
    assert proc.returncode == 0
    assert took < 10, took
