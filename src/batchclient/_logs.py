"""How much of vLLM's own output reaches the terminal.

vLLM logs at INFO: starting one engine prints about 66 lines. batchclient shows only vLLM's
warnings and errors unless asked for everything: ``verbose=True`` (``VLLMBatchInference``,
``VLLMProvider``, ``testing.vllm_server``), ``--verbose`` (``batchclient run``, ``bench``,
``demo``) or the environment variable ``BATCHCLIENT_VERBOSE=1``. A ``VLLM_LOGGING_LEVEL`` the
user set always wins. vLLM reads that variable when its engine is configured (and when it is
imported), in this process and in every engine process it spawns, which inherit the
environment. Guide: ``docs/inline.md`` ("Logging").
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

VERBOSE_ENV = "BATCHCLIENT_VERBOSE"
"""Set to ``1`` (or ``true``, ``yes``, ``on``) to show everything vLLM prints."""

VLLM_LEVEL_ENV = "VLLM_LOGGING_LEVEL"
QUIET_LEVEL = "WARNING"

_lock = threading.Lock()
_holders = 0  # blocks inside vllm_logging() that set the variable and will remove it


def is_verbose(verbose: bool = False) -> bool:
    """Whether to show everything: ``verbose`` or ``$BATCHCLIENT_VERBOSE``."""
    return verbose or os.environ.get(VERBOSE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def vllm_env(verbose: bool = False) -> dict[str, str]:
    """Environment overrides that keep a vLLM child process quiet: ``{"VLLM_LOGGING_LEVEL":
    "WARNING"}``, or nothing when verbose or when the user set the variable."""
    if is_verbose(verbose) or VLLM_LEVEL_ENV in os.environ:
        return {}
    return {VLLM_LEVEL_ENV: QUIET_LEVEL}


@contextlib.contextmanager
def vllm_logging(verbose: bool = False) -> Iterator[bool]:
    """Within the block, vLLM configured here, and every process it spawns meanwhile, logs
    warnings and errors only (``VLLM_LOGGING_LEVEL=WARNING`` in ``os.environ``, removed again
    afterwards); yields whether it is quiet. Verbose, or with the variable set by the user,
    nothing changes. Blocks may overlap (two clients starting at once)."""
    global _holders
    with _lock:
        quiet = not is_verbose(verbose) and (_holders > 0 or VLLM_LEVEL_ENV not in os.environ)
        if quiet:
            os.environ[VLLM_LEVEL_ENV] = QUIET_LEVEL
            _holders += 1
    try:
        yield quiet
    finally:
        if quiet:
            with _lock:
                _holders -= 1
                if _holders == 0:
                    os.environ.pop(VLLM_LEVEL_ENV, None)


def copy_output(source: IO[bytes], log: Path, echo: IO[bytes] | None) -> threading.Thread:
    """Copy a child's output line by line to the end of the file ``log`` and to ``echo`` (the
    terminal) until it closes, in a daemon thread; returns the thread (join it after the child
    exits)."""

    def pump() -> None:
        with source, log.open("ab") as out:
            for line in iter(source.readline, b""):
                out.write(line)
                out.flush()
                if echo is not None:
                    with contextlib.suppress(OSError, ValueError):  # a closed terminal
                        echo.write(line)
                        echo.flush()

    thread = threading.Thread(target=pump, name="batchclient-output", daemon=True)
    thread.start()
    return thread
