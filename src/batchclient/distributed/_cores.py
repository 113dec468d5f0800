"""Per-node bookkeeping of engine replicas on CPU: which cores each one binds, and what a dead
one left behind.

Ray counts CPUs as scheduling tokens; it does not pin processes. So each replica claims a
**slot** of its node's cores itself: slot ``k`` is the ``k``-th group of ``cores_per_replica``
cores of the node's CPU affinity, held by an exclusive ``flock`` on a file in the node's temporary
directory for as long as the replica's process lives (the kernel releases it when the process
dies, however it dies). Next to the lock, a small JSON **record** lists the replica's engine
processes and the shared-memory segments they map (``/dev/shm/psm_*``: vLLM's message queues,
made with ``multiprocessing.shared_memory``). A replica killed with ``SIGKILL`` cannot unlink
them, and its engine processes may outlive it; :func:`reap` ends those processes and unlinks
those segments, and runs both when the next replica claims the slot and, on the driver's node,
as soon as the driver sees the replica die.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from .._cpu import affinity, core_list, split

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "psm_"  # multiprocessing.shared_memory's name prefix
_REAP_WAIT_S = 10.0


def slot_dir() -> Path:
    """Where this node's slot locks and records live (one directory per user)."""
    path = Path(tempfile.gettempdir()) / f"batchclient-replica-slots-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


@dataclass
class ProcessRef:
    """A process, told apart from a later one with the same pid by its start time."""

    pid: int
    create_time: float

    @classmethod
    def of(cls, proc: psutil.Process) -> ProcessRef:
        return cls(proc.pid, proc.create_time())

    def alive(self) -> psutil.Process | None:
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) < 0.01 and proc.is_running():
                return proc if proc.status() != psutil.STATUS_ZOMBIE else None
        except psutil.Error:
            pass
        return None


@dataclass
class SlotRecord:
    """What one replica left on its node: its slot, cores, processes and shared memory."""

    slot: int | None
    cores: list[int]
    replica: ProcessRef | None = None
    engine: list[ProcessRef] = field(default_factory=list)
    shm: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SlotRecord:
        replica = data.get("replica")
        return cls(
            slot=data.get("slot"),
            cores=list(data.get("cores") or []),
            replica=ProcessRef(**replica) if replica else None,
            engine=[ProcessRef(**p) for p in data.get("engine") or []],
            shm=[str(s) for s in data.get("shm") or []],
        )


class Slot:
    """A claimed slot (see the module docstring); released when the process exits."""

    def __init__(self, index: int | None, cores: list[int], lock: IO[bytes] | None) -> None:
        self.index = index
        self.cores = cores
        self._lock = lock

    @property
    def record_path(self) -> Path | None:
        return None if self.index is None else slot_dir() / f"cores-{core_list(self.cores)}.json"

    def write(self, record: SlotRecord) -> None:
        path = self.record_path
        if path is None:
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record.to_json()), encoding="utf-8")
        tmp.replace(path)

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def claim(cores_per_replica: int) -> Slot:
    """Claim the first free slot of ``cores_per_replica`` cores on this node; first reap what a
    dead predecessor in that slot left. With every slot taken (more replicas than the node has
    cores for) the slot is None and the replica binds every core."""
    cores = affinity()
    groups = split(cores, max(1, len(cores) // max(1, cores_per_replica)))
    for index, group in enumerate(groups):
        lock = (slot_dir() / f"cores-{core_list(group)}.lock").open("ab")
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        slot = Slot(index, group, lock)
        previous = read_record(slot.record_path)
        if previous is not None:
            reap(previous)
        return slot
    return Slot(None, cores, None)


def read_record(path: Path | None) -> SlotRecord | None:
    if path is None or not path.exists():
        return None
    try:
        return SlotRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def engine_record(slot: Slot) -> SlotRecord:
    """This process (the replica), its engine processes and the shared-memory segments any of
    them maps, as they are now (after the engine started)."""
    me = psutil.Process()
    engine = []
    with contextlib.suppress(psutil.Error):
        engine = me.children(recursive=True)
    shm: set[str] = set()
    for proc in [me, *engine]:
        with contextlib.suppress(psutil.Error):
            for mapping in proc.memory_maps(grouped=True):
                if mapping.path.startswith(f"{SHM_DIR}/{SHM_PREFIX}"):
                    shm.add(mapping.path)
    return SlotRecord(
        slot=slot.index,
        cores=slot.cores,
        replica=ProcessRef.of(me),
        engine=[ProcessRef.of(p) for p in engine if _quiet(p)],
        shm=sorted(shm),
    )


def _quiet(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        proc.create_time()
        return True
    return False


def reap(record: SlotRecord, wait_s: float = _REAP_WAIT_S) -> list[str]:
    """End what a dead replica left: its engine processes (after up to ``wait_s`` to exit on
    their own) and its shared-memory segments. Waits up to ``wait_s`` for the replica's own
    process to exit (a caller sees the actor fail a moment before its process is gone), and
    does nothing if it still runs. Returns the segments unlinked."""
    replica = None if record.replica is None else record.replica.alive()
    if replica is not None:
        try:
            replica.wait(wait_s)
        except psutil.TimeoutExpired:
            return []
        except psutil.Error:
            pass
    procs = [p for p in (ref.alive() for ref in record.engine) if p is not None]
    _, alive = psutil.wait_procs(procs, timeout=wait_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=_REAP_WAIT_S)
    removed = []
    for name in record.shm:
        path = Path(name)
        if path.parent != SHM_DIR or not path.name.startswith(SHM_PREFIX):
            continue  # never unlink anything else, whatever the record says
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(name)
    return removed
