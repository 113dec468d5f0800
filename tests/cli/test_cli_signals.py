"""SIGTERM stops a ``batchclient`` command as Ctrl-C does (``batchclient.cli._signals``): the
``finally`` blocks and ``async with`` exits of the command run, in plain code and inside
``anyio.run``; without it, Python's default SIGTERM ends the process with none of them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = str(Path(__file__).parents[2] / "src")

SYNC = """
import sys, time
from batchclient.cli._signals import sigterm_as_interrupt
try:
    with sigterm_as_interrupt():
        try:
            print("ready", flush=True)
            time.sleep(60)
        finally:
            open(sys.argv[1], "w").write("cleaned up")
except KeyboardInterrupt:
    sys.exit(130)
"""

ASYNC = """
import sys, anyio
from batchclient.cli._signals import sigterm_as_interrupt

async def main():
    try:
        print("ready", flush=True)
        await anyio.sleep(60)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.1)  # an async clean-up, as an engine's stop is
            open(sys.argv[1], "w").write("cleaned up")

try:
    with sigterm_as_interrupt():
        anyio.run(main)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.slow
@pytest.mark.parametrize("code", [SYNC, ASYNC], ids=["sync", "anyio"])
@pytest.mark.parametrize("handled", [True, False], ids=["handled", "default"])
def test_sigterm_runs_the_clean_up(tmp_path: Path, code: str, handled: bool) -> None:
    if not handled:  # the control: Python's default action skips every clean-up
        code = code.replace("with sigterm_as_interrupt():", "if True:")
    marker = tmp_path / "marker"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(marker)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == (130 if handled else -signal.SIGTERM)
    assert marker.exists() is handled
