"""How the ``batchclient`` command ends: SIGTERM does what Ctrl-C does, so ``kill``,
``timeout`` and process managers stop a command as cleanly as a terminal does; and the process
exits without the interpreter's slow teardown of vLLM (:func:`exit_now`).

Python's default SIGTERM action ends the process at once: no ``finally`` runs, so the vLLM
server, the engine processes and the benchmark's run children (each in its own session or
process group, out of reach of a signal sent to this process) would outlive it. Within
:func:`sigterm_as_interrupt`, SIGTERM calls whatever handles SIGINT at that moment: Python's
default raises ``KeyboardInterrupt`` (so ``finally`` blocks and context managers stop what they
started), and inside ``anyio.run`` / ``asyncio.run`` the runner's own handler cancels the main
task, which unwinds every ``async with`` before ``KeyboardInterrupt`` reaches the caller.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import NoReturn


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIGINT ignored or default-terminating: still stop cleanly
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM is handled as SIGINT is (main thread only; elsewhere a no-op)."""
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: signals are not ours to handle
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_now(code: int) -> NoReturn:
    """End the process with ``code``: exit handlers run and output is flushed, but, once vLLM
    or torch is imported, the interpreter's teardown of their modules is skipped (5-15 s on a
    busy 2-core machine, after the work is done and every child process has stopped)."""
    heavy = any(name in sys.modules for name in ("vllm", "torch"))
    if not heavy:
        sys.exit(code)
    atexit._run_exitfuncs()  # logging's flush, multiprocessing's finalizers
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
