"""The defaults of every vLLM engine batchclient starts, decided in one place, by the hardware.

Every engine the library starts takes its defaults from :func:`decide`: the inline provider
(``VLLMBatchInference`` / ``VLLMProvider``, and so each Ray replica, which runs one), the vLLM
OpenAI server of ``batchclient.testing.vllm_server`` (``make demo``, ``batchclient bench``, the
tests) and the benchmark's raw ``vllm.LLM`` mode. A value the caller gives always wins.

- **dtype.** On a CPU build of vLLM: ``bfloat16`` only where the CPU has bfloat16 arithmetic
  (``amx_bf16`` or ``avx512_bf16`` among the ``/proc/cpuinfo`` flags), else ``float32``.
  Without it, bfloat16 is emulated and slow: SmolLM2-135M ran 44 output tok/s in bfloat16
  against 215 in float32 on an AVX2-only AMD EPYC, while on AMX machines bfloat16 is the fast
  one. Not Linux, or flags unreadable: ``float32`` (slower at worst, never emulated). On GPUs
  ``auto`` (the checkpoint's own dtype).
- **KV cache.** On a CPU build, 2 GiB (``kv_cache_memory_bytes``) unless
  ``gpu_memory_utilization``, ``kv_cache_memory_bytes`` or ``VLLM_CPU_KVCACHE_SPACE`` sizes
  it: vLLM's CPU default reserves 92 % of the machine's memory and fails unless that much is
  free. On GPUs vLLM's own ``gpu_memory_utilization``.
- **Prefix caching.** ``enable_prefix_caching=True`` for generating models unless given:
  prompts that share a prefix (a system prompt, few-shot shots, a context scored with
  several continuations) reuse its KV blocks instead of prefilling it again. vLLM's own
  default for decoder models on x86/ARM CPUs and GPUs is the same (off only on RISC-V CPUs and
  for MLA models on CPU, where vLLM turns it off itself); stated here so the log and the
  benchmark's settings say it. Pooling models keep vLLM's choice (off for mean/CLS pooling).
  vLLM does not *read* the cache for a request that asks for prompt log-probabilities
  (``skip_reading_prefix_cache`` defaults to on for them), so such scoring requests prefill
  their whole prompt either way; they still fill the cache for generation that follows. The
  inline provider scores continuations of up to 16 tokens without them, reading the cache
  (``single_token_scoring``).
- **Thread binding.** On a CPU build, unless ``VLLM_CPU_OMP_THREADS_BIND`` is set, the compute
  threads are bound to the cores given, else to every core of this process's CPU affinity
  (``batchclient._cpu`` turns the cores into vLLM's syntax and sets the variable;
  its docstring says why every core).
- **Stop grace.** How long a stopping engine or server may take to exit before it is killed
  (:func:`stop_grace_s`): 30 s, 3 s inside :func:`quick_engine_stops` (the ``batchclient``
  command).

Nothing here imports vLLM or torch: whether vLLM runs on the CPU comes from vLLM's platform
when it is already imported, else from the same rule vLLM's CPU platform plugin applies (an
installed CPU build, ``VLLM_TARGET_DEVICE=cpu``, or macOS), which costs no torch import. Each
engine start logs its choices once, at INFO on the ``batchclient`` logger.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

logger = logging.getLogger("batchclient")

THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"
"""vLLM's environment variable for the compute threads' cores (CPU builds)."""
KVCACHE_SPACE = "VLLM_CPU_KVCACHE_SPACE"
"""vLLM's environment variable for the KV cache size in GiB (CPU builds)."""
DEFAULT_KV_CACHE_BYTES = 2 << 30
"""KV cache on CPU when nothing else sizes it (2 GiB: about 58k tokens of SmolLM2-135M)."""
MEMORY_ARGS = ("gpu_memory_utilization", "kv_cache_memory_bytes")
"""Engine arguments that size the KV cache."""

_BF16_FLAGS = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"))


@dataclass(frozen=True)
class Choice(Generic[T]):
    """One decided default: its value and why (``"given"`` when the caller set it)."""

    value: T
    reason: str


def cpu_flags(cpuinfo: str | None) -> frozenset[str]:
    """The feature flags of the first CPU in ``/proc/cpuinfo`` text (its ``flags`` line; ARM
    calls it ``Features``); empty for None or text without one."""
    for line in (cpuinfo or "").splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def bf16_arithmetic(cpuinfo: str | None) -> str | None:
    """The CPU feature that does bfloat16 arithmetic (``"AMX"``, ``"AVX512-BF16"``), or None."""
    flags = cpu_flags(cpuinfo)
    return next((name for flag, name in _BF16_FLAGS if flag in flags), None)


@functools.cache
def read_cpuinfo() -> str | None:
    """This machine's ``/proc/cpuinfo`` (None when it has none: not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def vllm_on_cpu() -> bool:
    """Whether vLLM runs on the CPU here: vLLM's own platform when it is already imported,
    else vLLM's CPU platform rule (a CPU build installed, ``VLLM_TARGET_DEVICE=cpu``, macOS)."""
    platforms = sys.modules.get("vllm.platforms")
    if platforms is not None:
        try:
            return bool(platforms.current_platform.is_cpu())
        except Exception:  # a platform that fails to resolve: fall back to the rule
            pass
    return _cpu_build()


@functools.cache
def _cpu_build() -> bool:
    if os.environ.get("VLLM_TARGET_DEVICE", "").lower() == "cpu" or sys.platform == "darwin":
        return True
    from importlib.metadata import PackageNotFoundError, version

    try:
        return "cpu" in version("vllm")
    except PackageNotFoundError:
        try:
            version("vllm-cpu")
        except PackageNotFoundError:
            return False
        return True


def choose_dtype(given: Any = None, *, cpu: bool, cpuinfo: str | None = None) -> Choice[str]:
    """The engine's ``dtype``: ``given`` when not None, else by the hardware (module
    docstring). ``cpuinfo``: ``/proc/cpuinfo`` text (default: this machine's)."""
    if given is not None:
        return Choice(str(given), "given")
    if not cpu:
        return Choice("auto", "the checkpoint's, on a GPU")
    feature = bf16_arithmetic(read_cpuinfo() if cpuinfo is None else cpuinfo)
    if feature is None:
        return Choice("float32", "no bfloat16 arithmetic on this CPU")
    return Choice("bfloat16", f"this CPU has {feature}")


def choose_kv_cache(
    given: Mapping[str, Any], *, cpu: bool, environ: Mapping[str, str] | None = None
) -> Choice[int | None]:
    """``kv_cache_memory_bytes`` to add (None: add nothing) for an engine whose arguments are
    ``given`` and whose environment is ``environ`` (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    if not cpu:
        return Choice(None, "vLLM's gpu_memory_utilization")
    sized = [f"{k}={given[k]}" for k in MEMORY_ARGS if given.get(k) is not None]
    if sized:
        return Choice(None, f"{sized[0]} given")
    if env.get(KVCACHE_SPACE):
        return Choice(None, f"{KVCACHE_SPACE}={env[KVCACHE_SPACE]} GiB given")
    return Choice(DEFAULT_KV_CACHE_BYTES, "the CPU default")


def choose_prefix_caching(given: Mapping[str, Any]) -> Choice[bool | None]:
    """``enable_prefix_caching`` to add (None: add nothing) for an engine whose arguments are
    ``given`` (module docstring)."""
    value = given.get("enable_prefix_caching")
    if value is not None or given.get("no_enable_prefix_caching"):  # the server's --no-... flag
        return Choice(None, f"enable_prefix_caching={bool(value)} given")
    if given.get("runner") == "pooling":
        return Choice(None, "vLLM's choice for a pooling model")
    return Choice(True, "shared prefixes reuse their KV cache")


def affinity() -> list[int]:
    """The cores this process may run on (sorted), e.g. ``[0, 1]``."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def choose_cores(
    cores: Sequence[int] | None = None,
    *,
    cpu: bool,
    environ: Mapping[str, str] | None = None,
) -> Choice[list[int] | None]:
    """The cores to bind the engine's compute threads to (None: batchclient binds nothing,
    vLLM's variable or vLLM's GPU path decides)."""
    env = os.environ if environ is None else environ
    if not cpu:
        return Choice(None, "GPU")
    if env.get(THREADS_BIND):
        return Choice(None, f"{THREADS_BIND}={env[THREADS_BIND]} given")
    if cores is not None:
        return Choice(sorted(set(cores)), "given")
    return Choice(affinity(), "every core of this process's affinity")


@dataclass(frozen=True)
class EngineDefaults:
    """What :func:`decide` chose for one engine."""

    cpu: bool
    dtype: Choice[str]
    kv_cache_bytes: Choice[int | None]
    cores: Choice[list[int] | None]
    prefix_caching: Choice[bool | None] = Choice(None, "not decided")

    def apply(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """``args`` with the chosen ``dtype``, ``kv_cache_memory_bytes`` and
        ``enable_prefix_caching`` added where the caller gave none."""
        out = dict(args)
        if out.get("dtype") is None:
            out["dtype"] = self.dtype.value
        if self.kv_cache_bytes.value is not None:
            out["kv_cache_memory_bytes"] = self.kv_cache_bytes.value
        if self.prefix_caching.value is not None:
            out["enable_prefix_caching"] = self.prefix_caching.value
        return out

    def describe(self, binding: str | None) -> str:
        """One line for the log, e.g. ``dtype=float32 (no bfloat16 arithmetic on this CPU);
        kv_cache_memory_bytes=2 GiB (the CPU default); threads bound to 0-1 (every core of
        this process's affinity)``. ``binding``: the ``VLLM_CPU_OMP_THREADS_BIND`` value the
        engine gets."""
        kv = self.kv_cache_bytes
        parts = [
            f"dtype={self.dtype.value} ({self.dtype.reason})",
            f"kv_cache_memory_bytes={kv.value / 2**30:g} GiB ({kv.reason})"
            if kv.value is not None
            else f"KV cache: {kv.reason}",
        ]
        if self.prefix_caching.value is not None:
            parts.append(
                f"enable_prefix_caching={self.prefix_caching.value} ({self.prefix_caching.reason})"
            )
        if self.cpu:
            cores = self.cores
            where = binding or "vLLM's default (auto)"
            parts.append(f"threads bound to {where} ({cores.reason})")
        return "; ".join(parts)

    def log(self, what: str, binding: str | None = None) -> None:
        """Log the choices once, at INFO on the ``batchclient`` logger."""
        logger.info("%s: %s", what, self.describe(binding))


def decide(
    given: Mapping[str, Any],
    *,
    cores: Sequence[int] | None = None,
    cpu: bool | None = None,
    cpuinfo: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> EngineDefaults:
    """The defaults of an engine whose caller gave the engine arguments ``given`` (a
    ``dtype`` of None counts as not given) and ``cores``. ``cpu``: whether vLLM runs on the
    CPU (default :func:`vllm_on_cpu`); ``cpuinfo`` and ``environ`` default to this machine's."""
    on_cpu = vllm_on_cpu() if cpu is None else cpu
    return EngineDefaults(
        cpu=on_cpu,
        dtype=choose_dtype(given.get("dtype"), cpu=on_cpu, cpuinfo=cpuinfo),
        kv_cache_bytes=choose_kv_cache(given, cpu=on_cpu, environ=environ),
        cores=choose_cores(cores, cpu=on_cpu, environ=environ),
        prefix_caching=choose_prefix_caching(given),
    )


# ---------------------------------------------------------------------------- stopping

STOP_GRACE_S = 30.0
"""How long a stopping engine's processes may take to exit on their own before they are
killed. An engine core's clean exit takes 10-15 s on a busy 2-core machine (its workers first,
then its interpreter's teardown of vLLM, torch and transformers); one killed earlier leaves its
shared-memory queues to Python's resource tracker, which unlinks them when the process that
started the engine exits."""
QUICK_STOP_GRACE_S = 3.0
""":data:`STOP_GRACE_S` inside :func:`quick_engine_stops`: for commands that exit right after
(the ``batchclient`` command), where the resource tracker's clean-up follows at once."""

_stop_grace = [STOP_GRACE_S]


def stop_grace_s() -> float:
    """The grace the engines and servers this process stops now get, in seconds."""
    return _stop_grace[-1]


@contextlib.contextmanager
def quick_engine_stops(grace_s: float = QUICK_STOP_GRACE_S) -> Iterator[None]:
    """Within the block, engines and vLLM servers stopped by this process get ``grace_s``
    seconds to exit before their processes are killed (default :data:`STOP_GRACE_S`)."""
    _stop_grace.append(grace_s)
    try:
        yield
    finally:
        _stop_grace.pop()
