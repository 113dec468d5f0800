"""Thread binding of CPU engines (``batchclient._cpu``): pure, no engine."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from batchclient import _cpu as _binding  # moved from batchclient.inline


def test_core_lists_in_vllm_syntax() -> None:
    assert _binding.core_list([0, 1]) == "0-1"
    assert _binding.core_list([5, 0, 1, 2]) == "0-2,5"
    assert _binding.core_list([3]) == "3"


def test_split_and_masks() -> None:
    assert _binding.split([0, 1, 2, 3], 2) == [[0, 1], [2, 3]]
    assert _binding.split([0, 1, 2], 2) == [[0], [1]]  # the leftover core stays free
    assert _binding.split([0], 2) == []
    assert _binding.bind_mask([0, 1]) == "0-1"
    assert _binding.bind_mask([0, 1], 2) == "0|1"
    assert _binding.bind_mask([0], 2) is None  # too few cores: vLLM's own default stays


def test_workers_count_every_parallel_rank() -> None:
    assert _binding.engine_workers({}) == 1
    assert _binding.engine_workers({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}) == 4
    assert _binding.engine_workers({"data_parallel_size": 2, "tensor_parallel_size": None}) == 2


def test_default_is_every_core_unless_the_caller_set_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(_binding.THREADS_BIND, raising=False)
    assert _binding.default_mask({}, [0, 1]) == "0-1"
    assert _binding.default_mask({"tensor_parallel_size": 2}, [0, 1, 2, 3]) == "0-1|2-3"
    assert _binding.default_mask({}) == _binding.bind_mask(sorted(os.sched_getaffinity(0)))
    monkeypatch.setenv(_binding.THREADS_BIND, "auto")
    assert _binding.default_mask({}, [0, 1]) is None


def test_bound_sets_the_variable_only_while_the_engine_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(_binding.THREADS_BIND, raising=False)
    with _binding.bound("0-1"):
        assert os.environ[_binding.THREADS_BIND] == "0-1"
    assert _binding.THREADS_BIND not in os.environ
    monkeypatch.setenv(_binding.THREADS_BIND, "0")
    with _binding.bound("1"):
        assert os.environ[_binding.THREADS_BIND] == "1"
    assert os.environ[_binding.THREADS_BIND] == "0"
    with _binding.bound(None):
        assert os.environ[_binding.THREADS_BIND] == "0"


def test_reap_ends_a_dead_replicas_processes_and_unlinks_only_its_shared_memory(
    tmp_path: Path,
) -> None:
    """A stand-in replica process that is gone, an orphaned 'engine' process still running,
    and two segments: one of ours on record and a file elsewhere the record also names."""
    import subprocess
    import sys
    from multiprocessing import shared_memory

    import psutil

    from batchclient.distributed import _cores

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_ref = _cores.ProcessRef.of(psutil.Process(gone.pid))
    gone.wait()
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    segment = shared_memory.SharedMemory(create=True, size=16)
    outside = tmp_path / "psm_not_in_dev_shm"
    outside.write_text("keep")
    try:
        record = _cores.SlotRecord(
            slot=0,
            cores=[0],
            replica=gone_ref,
            engine=[_cores.ProcessRef.of(psutil.Process(orphan.pid))],
            shm=[f"/dev/shm/{segment.name}", str(outside)],
        )
        removed = _cores.reap(record, wait_s=0.2)
        assert removed == [f"/dev/shm/{segment.name}"]
        assert not Path(f"/dev/shm/{segment.name}").exists() and outside.exists()
        assert orphan.wait(timeout=5) is not None  # ended after its grace
    finally:
        orphan.kill()
        segment.close()
        with contextlib.suppress(FileNotFoundError):
            segment.unlink()


def test_reap_leaves_a_live_replica_alone() -> None:
    import psutil

    from batchclient.distributed import _cores

    me = _cores.ProcessRef.of(psutil.Process())
    assert me.alive() is not None
    stale = _cores.ProcessRef(me.pid, me.create_time - 100)  # same pid, another process
    assert stale.alive() is None
