"""Who runs a job, and whether that process is still alive, without trusting a pid.

A running job's row names its ``owner`` (``host:pid:token``, the token random per job manager,
so a manager started again has another one even with the same pid, as PID 1 in a container
always has). Each job manager holds an exclusive ``flock`` on ``owners/<token>.lock`` in the
state directory for as long as it is open, and records with its leases ``owner_kernel``, the
kernel's boot id of its machine, only when it holds that lock. The kernel drops the lock when
the process dies, SIGKILL included, whatever pid namespace it ran in, so another process on the
same kernel knows for sure: a lock that can be taken, or a lock file that is gone, is a dead
owner, at once (:func:`owner_gone`).

Where the lock cannot tell (another machine on a network file system, a row from before the
lock files, a state directory where the lock file could not be made), the rules are the old
ones: a dead pid on this host, or a heartbeat older than the lease. A held lock whose heartbeat
is older than the lease is still orphaned: a process forked from the owner (which inherits the
lock) must not keep its jobs forever.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import math
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigurationError

OWNERS_DIR = "owners"
"""The folder of the owners' lock files, in the state directory."""
LEASE_TIMES_ENV = "BATCHCLIENT_LEASE_TIMES"


@dataclass(frozen=True)
class LeaseTimes:
    """How a job manager keeps its leases, in seconds.

    Attributes:
        lease_s: a job whose owner has not refreshed its heartbeat for this long is orphaned,
            where the owner's lock cannot tell (and even where it is held: see above).
        heartbeat_s: how often a manager refreshes its leases, stops a job cancelled from
            another process and retries writing a failure a full disk refused.
        orphan_scan_s: how often a manager with a provider looks for orphaned jobs to take
            back (it also looks on entry).

    Short times make a manager react sooner and write its database more often; ``lease_s``
    must stay well above ``heartbeat_s`` on a loaded machine, or a live owner looks dead.
    """

    lease_s: float = 10.0
    heartbeat_s: float = 1.0
    orphan_scan_s: float = 2.0

    def __post_init__(self) -> None:
        for name, value in dataclasses.asdict(self).items():
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigurationError(f"LeaseTimes.{name} must be a positive number of seconds")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> LeaseTimes:
        """The defaults, with the ``name=seconds`` pairs of ``$BATCHCLIENT_LEASE_TIMES``
        (``heartbeat_s=0.05,orphan_scan_s=0.1``) over them: how tests shorten the times in
        processes they start. Raises ``ConfigurationError`` for an unknown name or a bad
        number."""
        given = environ.get(LEASE_TIMES_ENV, "").strip()
        if not given:
            return cls()
        names = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, float] = {}
        for pair in given.split(","):
            name, _, text = (part.strip() for part in pair.partition("="))
            if name not in names:
                raise ConfigurationError(
                    f"${LEASE_TIMES_ENV}: unknown {name!r}; known: {', '.join(sorted(names))}"
                )
            try:
                values[name] = float(text)
            except ValueError:
                raise ConfigurationError(
                    f"${LEASE_TIMES_ENV}: {name} must be a number of seconds, not {text!r}"
                ) from None
        return cls(**values)


def kernel_boot_id() -> str | None:
    """The running kernel's boot id (Linux), shared by every container on the machine and new
    at each boot; None where there is none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def new_owner() -> str:
    """A fresh owner name: ``host:pid:token`` (96 random bits)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(12)}"


def _lock_path(state_dir: Path, owner: str) -> Path | None:
    token = owner.rsplit(":", 1)[-1]
    if not token or not all(c in "0123456789abcdef" for c in token):
        return None  # not a name this module made: never a path from it
    return state_dir / OWNERS_DIR / f"{token}.lock"


def hold(fd: int, path: Path | None = None) -> bool:
    """Lock an open file for as long as it stays open, so that :func:`remove_if_unlocked`
    leaves it alone (a file system without ``flock``: nothing). With ``path`` (the name it was
    just created under): whether that name still is this file. False when a sweep removed it
    between its creation and this lock; the caller then creates it again."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if path is None:
        return True
    try:
        named, held = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


class OwnerLock:
    """The lock that says "``owner`` is alive" while this process holds it (blocking calls)."""

    def __init__(self, state_dir: Path, owner: str) -> None:
        self.path = _lock_path(state_dir, owner)
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Create and lock the file; False (and no lock) when the folder is not writable."""
        if self.path is None:
            return False
        try:
            self.path.parent.mkdir(mode=0o700, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is None or self.path is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()  # before unlocking: a checker never finds a free lock of ours
        os.close(self._fd)
        self._fd = None


def owner_gone(state_dir: Path, owner: str) -> bool | None:
    """Whether ``owner``, which took its lease holding its lock file, is dead: True (the lock
    was free: the file is removed; or the file is gone already), False (held: alive, or a
    child it forked is), None (the file cannot be asked)."""
    path = _lock_path(state_dir, owner)
    if path is None:
        return None
    gone = remove_if_unlocked(path)
    if gone is None and not path.exists():
        return True  # its owner removed it on closing, or a sweep after its death did
    return gone


def remove_if_unlocked(path: Path) -> bool | None:
    """Remove ``path`` if no process holds a ``flock`` on it: True (removed), False (held),
    None (it could not be opened or locked: left alone)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError:
            return None  # a file system without flock: it cannot tell
        with contextlib.suppress(OSError):
            path.unlink()
        return True
    finally:
        os.close(fd)


def sweep_owner_locks(state_dir: Path) -> int:
    """Remove the lock files of dead owners (left by SIGKILL); the number removed."""
    folder = state_dir / OWNERS_DIR
    try:
        paths = [p for p in folder.iterdir() if p.suffix == ".lock"]
    except OSError:
        return 0
    return sum(remove_if_unlocked(p) is True for p in paths)
