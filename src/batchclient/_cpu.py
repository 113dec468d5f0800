"""Which CPU cores a vLLM engine's compute threads are bound to, on CPU builds of vLLM.

vLLM's CPU backend pins its OpenMP compute threads by ``VLLM_CPU_OMP_THREADS_BIND``. Its default,
``auto``, binds each worker to the cores of one NUMA node *minus one core per worker* that it
reserves for the front end (``vllm/utils/ompmultiprocessing.py``: ``reserve_cpu_num``). On a
small machine that leaves the engine half the cores: on 2 cores one engine ran at 417 output
tok/s with ``auto`` and 664 with ``0-1``; the front end (rendering, output processing) needs
only a small share of a core and the OS schedules it beside the compute threads.

So when the caller has not set ``VLLM_CPU_OMP_THREADS_BIND``, batchclient binds the engine to
every core of this process's CPU affinity (``os.sched_getaffinity``), split evenly between the
engine's workers (tensor x pipeline x data parallel ranks) in vLLM's ``"0-3|4-7"`` syntax. A
caller who sets the variable (any value, ``auto`` and ``nobind`` included) keeps it. Nothing here
imports vLLM. Used by the inline engine, the Ray replicas (``distributed/_cores.py`` claims a
group of cores per replica) and the benchmark harness.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ._engine_defaults import choose_cores  # the rule lives there

THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"
"""vLLM's environment variable for the compute threads' cores (``auto``, ``nobind``, or core
lists such as ``0-3`` or ``0-1|2-3``, one list per worker)."""

_ENV_LOCK = threading.Lock()  # one engine start at a time edits os.environ


def affinity() -> list[int]:
    """The cores this process may run on (sorted), e.g. ``[0, 1]``."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def core_list(cores: Sequence[int]) -> str:
    """Cores in vLLM's list syntax, ranges collapsed: ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts: list[str] = []
    ordered = sorted(set(cores))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def split(cores: Sequence[int], parts: int) -> list[list[int]]:
    """``cores`` in ``parts`` contiguous groups of equal size (leftover cores unused), or
    ``[]`` when there are fewer cores than parts."""
    if parts < 1 or len(cores) < parts:
        return []
    size = len(cores) // parts
    ordered = sorted(cores)
    return [ordered[k * size : (k + 1) * size] for k in range(parts)]


def bind_mask(cores: Sequence[int], workers: int = 1) -> str | None:
    """The ``VLLM_CPU_OMP_THREADS_BIND`` value giving ``workers`` workers equal shares of
    ``cores`` (``"0-1"``; two workers: ``"0|1"``), or None when there are too few cores."""
    groups = split(cores, workers)
    return "|".join(core_list(g) for g in groups) if groups else None


def engine_workers(args: Mapping[str, Any]) -> int:
    """How many CPU workers an engine with these arguments runs on this machine (each needs
    its own core list): tensor x pipeline x data parallel size."""
    product = 1
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        value = args.get(name)
        product *= int(value) if isinstance(value, int) and value > 0 else 1
    return product


def default_mask(args: Mapping[str, Any], cores: Sequence[int] | None = None) -> str | None:
    """The binding batchclient gives an engine with ``args`` when ``VLLM_CPU_OMP_THREADS_BIND``
    is not set: every core of ``cores`` (default: this process's affinity), split between its
    workers. None when the variable is set (the caller's choice stands) or cores are too few."""
    chosen = choose_cores(cores, cpu=True).value
    return None if chosen is None else bind_mask(chosen, engine_workers(args))


@contextlib.contextmanager
def bound(mask: str | None) -> Iterator[None]:
    """Set ``VLLM_CPU_OMP_THREADS_BIND=mask`` while an engine starts (its processes inherit the
    environment when they are spawned), then restore the previous environment. No-op for None."""
    if mask is None:
        yield
        return
    with _ENV_LOCK:
        previous = os.environ.get(THREADS_BIND)
        os.environ[THREADS_BIND] = mask
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(THREADS_BIND, None)
            else:
                os.environ[THREADS_BIND] = previous
