"""``JobManager``: the files and jobs of one state directory, and the jobs running in this
process.

Every provider client owns one (created in its ``__aenter__``); the ``batchclient jobs`` commands
open one without a provider (they list, inspect, cancel, reopen and export, not run). Jobs run
in the manager's task group, hosted by a task of its own (so a client may be entered and closed
from different tasks, as pytest-asyncio session fixtures do): they live exactly as long as the
client's ``async with`` block. Leaving it pauses them (they stay ``in_progress``); the next
client on the same state directory with the same provider identity resumes them.

Leases: a running job's row names its ``owner`` (host, pid, a token random per manager) and a
``heartbeat_at`` refreshed every second; the manager holds its owner's lock file while it is
open (:mod:`._lease`). Only orphaned jobs are resumed: the owner's lock is free (it died, on
this machine, whatever its pid), or, where the lock cannot tell, its pid is dead on this host
or its heartbeat is older than the lease (:class:`LeaseTimes`: 10 s). A manager with a provider
looks for orphans on entry and every 2 s while open, so a server started again at once (same pid,
as PID 1 in a container) takes its batches back within seconds. A cancel from another process
marks the job ``cancelling``; its owner stops it at its next heartbeat. Guide: ``docs/jobs.md``.

The result cache (:mod:`batchclient.cache`) is opened with the database when ``cache=True`` or
a batch asks for it; :meth:`JobManager.cached_provider` is the provider behind it that calls and
batches share.

Late failures: a batch whose files cannot be written, or whose state directory fails under it
after validation (a full or read-only disk while results are committed), ends ``failed`` with
the error's code and a log line (``batchclient.jobs``). When even that cannot be recorded (the
disk is full), this manager reports it ``failed`` all the same and records it as soon as the
disk takes a write again (tried every heartbeat); a process that dies first leaves it active,
resumed like a crashed one. Its committed results stay readable (``job_result``) and
:meth:`JobManager.resume` takes it up again, sending only what has no result.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any, NamedTuple, Self, Unpack

import anyio
from anyio import to_thread
from anyio.abc import TaskGroup

from .._core.provider import Provider
from .._core.responses import ResponsesOverChat, over_chat
from .._state import STORAGE_ERRORS, bind, database_url
from ..cache import ResultCache
from ..cache._provider import CachedProvider
from ..errors import ConfigurationError, JobError, JobStateError
from ..types import (
    Batch,
    BatchChatCompletionResponse,
    BatchCompletionResponse,
    BatchEmbeddingsResponse,
    BatchError,
    BatchErrors,
    BatchModerationResponse,
    BatchOptions,
    BatchResponse,
    BatchStatus,
    Endpoint,
    JobStatus,
)
from ._files import Files, sweep_temporary
from ._lease import LeaseTimes, OwnerLock, new_owner, owner_gone, sweep_owner_locks
from ._output import iter_output_lines, response_for, write_lines
from ._progress import ProgressTracker
from ._recovery import failure_of, late_result, reopen
from ._runner import JobRunner, RunningJob, finalize, help_run, parse_window, run_job
from ._store import DB_NAME, KERNEL, JobRow, LeaseLostError, Store, default_state_dir, now

logger = logging.getLogger("batchclient.jobs")

_Page = list[Any]  # a page of result items (the class's ``list`` method hides the builtin there)
_RESPONSES: dict[Endpoint, type[BatchResponse]] = {
    Endpoint.chat_completions: BatchChatCompletionResponse,
    Endpoint.completions: BatchCompletionResponse,
    Endpoint.embeddings: BatchEmbeddingsResponse,
    Endpoint.responses: BatchChatCompletionResponse,  # each line as the chat answer it stands for
    Endpoint.moderations: BatchModerationResponse,
}

_STATUS_MAP = {
    "validating": JobStatus.scheduled,
    "in_progress": JobStatus.in_progress,
    "finalizing": JobStatus.in_progress,
    "cancelling": JobStatus.in_progress,
    "completed": JobStatus.completed,
    "failed": JobStatus.failed,
    "expired": JobStatus.failed,
    "cancelled": JobStatus.cancelled,
}


HELP_AGAIN_S = 30.0
"""After a helping pass that found no free block of a batch, how long before another."""


class JobManager:
    """Files and jobs in ``state_dir`` (default :func:`default_state_dir`). Use as
    ``async with``. With a ``provider`` it runs jobs (and resumes orphaned ones whose
    provider identity matches, on entry and every ``lease_times.orphan_scan_s``, after removing
    the temporary files a crash left); without one it can only inspect, cancel, reopen a batch
    that failed after validation (for a manager with a provider to run) and export.
    ``files`` and ``batches`` are the same calls as a client's. ``cache``: batches created here
    use the result cache unless they say otherwise (``batches.create(..., cache=False)``).
    ``runner`` replaces how a job runs (default: :func:`run_job` over the provider's
    ``execute``, behind the result cache when the batch uses it). ``lease_times``: how it keeps
    its leases (default :meth:`LeaseTimes.from_env`: 10 s lease, 1 s heartbeat, 2 s scan).
    ``database``: a ``postgresql://`` URL (default ``$BATCHCLIENT_DATABASE_URL``, else None)
    where the state lives instead of the state directory's SQLite file, shared by managers of
    any process on any host (``state_dir`` then only caches files and holds temporary
    ones)."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        provider: Provider | None = None,
        cache: bool = False,
        runner: JobRunner | None = None,
        lease_times: LeaseTimes | None = None,
        database: str | None = None,
    ) -> None:
        self.state_dir = (
            Path(state_dir).expanduser() if state_dir is not None else default_state_dir()
        )
        url = database_url(database)
        if url is not None:
            bind(self.state_dir, url)
        # a provider that serves chat runs /v1/responses lines as chat (translated both ways)
        self._provider = over_chat(provider) if provider is not None else None
        self.cache = cache
        self._result_cache: ResultCache | None = None
        self._cached: CachedProvider | None = None
        self._runner = runner
        self._identity = json.dumps(provider.identity() if provider else {}, sort_keys=True)
        self.lease_times = lease_times if lease_times is not None else LeaseTimes.from_env()
        self.owner = new_owner()
        self._lock = OwnerLock(self.state_dir, self.owner)
        self._unrecorded: dict[str, tuple[BatchError, int]] = {}
        """Failures (and when) this manager could not write to the database yet (a full disk)."""
        self._store: Store | None = None
        self._tg: TaskGroup | None = None
        self._host: asyncio.Task[None] | None = None
        self._stop: anyio.Event | None = None
        self._running: dict[str, RunningJob] = {}
        self._helping: dict[str, RunningJob] = {}
        """Batches of other processes this one helps run (a shared database)."""
        self._idle_help: dict[str, float] = {}
        self._progress = ProgressTracker()
        self.recovered: list[str] = []
        """The batches this manager took back up from a process that ended: those found on
        entry (running by the time ``__aenter__`` returns), then those its scans find."""
        self.files = Files(self.store)
        self.batches = Batches(lambda: self)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        ready, self._stop = anyio.Event(), anyio.Event()
        self._host = asyncio.get_running_loop().create_task(self._host_tasks(ready))
        await ready.wait()
        if self._tg is None:  # the host failed before its task group opened
            await self._host
        try:
            if Store.exists(self.state_dir):
                store = await self.store()
                if self._provider is not None:
                    await to_thread.run_sync(_sweep, store)
                    await self._resume_orphans()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        host, self._host = self._host, None
        if host is not None and self._stop is not None:
            self._stop.set()  # pauses running jobs; they release their leases
            await host
        if self._result_cache is not None:
            await to_thread.run_sync(self._result_cache.close)
            self._result_cache = self._cached = None
        if self._store is not None:
            self._store.close()
            self._store = None
        self._lock.release()

    async def _host_tasks(self, ready: anyio.Event) -> None:
        """Own the task group for the manager's lifetime: entered and exited in this task."""
        assert self._stop is not None
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                ready.set()
                await self._stop.wait()
                tg.cancel_scope.cancel()
        finally:
            self._tg = None
            ready.set()

    async def store(self) -> Store:
        """The state directory's database, created on first use."""
        if self._tg is None:
            raise JobError("the job manager is not open: use it inside `async with`")
        if self._store is None:
            store = await to_thread.run_sync(Store, self.state_dir)
            store.owner = self.owner
            store.lease_s = self.lease_times.lease_s
            # before any lease is taken: a row never names an owner without its lock (a lock
            # file in this state directory says nothing to processes of a shared database)
            if not store.shared and await to_thread.run_sync(self._lock.acquire):
                store.kernel = KERNEL
            self._store = store
            assert self._tg is not None
            if self._provider is not None:
                self._tg.start_soon(self._heartbeat)
        return self._store

    async def result_cache(self) -> ResultCache:
        """The result cache of the state directory (its table is created on first use)."""
        await self.store()
        if self._result_cache is None:
            self._result_cache = await to_thread.run_sync(ResultCache, self.state_dir / DB_NAME)
        return self._result_cache

    def _provider_name(self) -> str:
        provider = self._provider
        inner = provider.inner if isinstance(provider, ResponsesOverChat) else provider
        return type(inner).__name__

    async def cached_provider(self) -> CachedProvider:
        """The manager's provider behind the result cache (one per manager: calls and batches
        share it). Raises ``ConfigurationError`` without a provider."""
        if self._provider is None:
            raise ConfigurationError("this job manager has no provider")
        if self._cached is None:
            self._cached = CachedProvider(self._provider, await self.result_cache())
        return self._cached

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        await self.store()
        return await to_thread.run_sync(lambda: fn(*args, **kwargs))

    # ------------------------------------------------------------------ leases

    def _orphaned(self, row: JobRow) -> bool:
        """Whether the job's lease holder is gone (blocking: it may ask a lock file)."""
        owner = row.owner
        if owner is None:
            return True
        if owner == self.owner:
            return False
        lease_s = self.lease_times.lease_s
        assert self._store is not None
        now_s = self._store.db.now()  # a shared database's clock: hosts' clocks may differ
        heartbeat_stale = row.heartbeat_at is None or now_s - row.heartbeat_at > lease_s
        if KERNEL is not None and row.owner_kernel == KERNEL:
            gone = owner_gone(self.state_dir, owner)
            if gone is not None:  # the lock knows, whatever the pid says
                return gone or heartbeat_stale
        host, pid, _ = [*owner.split(":"), "", "", ""][:3]
        if host == socket.gethostname() and pid.isdigit() and not _pid_alive(int(pid)):
            return True
        return heartbeat_stale

    async def _resume_orphans(self) -> None:
        store = await self.store()
        for row in await to_thread.run_sync(store.active_jobs):
            if row.id in self._running or row.id in self._unrecorded or row.id in self._helping:
                continue  # (a batch helped here is taken over, if need be, once the pass ends)
            mine = row.identity == self._identity
            if not mine and row.status not in ("finalizing", "cancelling"):
                continue  # another provider's job: it resumes with a client like the one it ran on
            if await to_thread.run_sync(self._orphaned, row):
                if await to_thread.run_sync(store.claim, row.id, self.owner, row.owner):
                    silent = store.db.now() - (row.heartbeat_at or 0.0)
                    logger.info(
                        "taking up batch %s (its owner %s is gone; last heartbeat %.1f s ago)",
                        row.id,
                        row.owner,
                        silent,
                    )
                    if row.owner is not None and store.shared:  # its blocks are free at once
                        await to_thread.run_sync(store.release_blocks, row.id, row.owner)
                    self._start(row.id)
                    self.recovered.append(row.id)
            elif mine and row.status == "in_progress" and self._may_help(store, row.id):
                self._help(row.id)

    def _may_help(self, store: Store, job_id: str) -> bool:
        """Whether to help run another live process's batch here: in a shared database, with
        the default runner, not already, and not within :data:`HELP_AGAIN_S` of a pass that
        found nothing to run."""
        return (
            store.shared
            and self._runner is None
            and self._provider is not None
            and job_id not in self._helping
            and time.monotonic() - self._idle_help.get(job_id, -HELP_AGAIN_S) >= HELP_AGAIN_S
        )

    def _help(self, job_id: str) -> None:
        assert self._tg is not None
        running = RunningJob(job_id)
        self._helping[job_id] = running
        logger.info("batch %s: helping its owner run its lines", job_id)
        self._tg.start_soon(self._help_run, running)

    async def _help_run(self, running: RunningJob) -> None:
        """One helping pass over another process's batch (blocks nobody holds); it never
        finishes or fails the batch, which stays its owner's."""
        store, job_id = self._store, running.job_id
        assert store is not None and self._provider is not None
        ran = True
        try:
            row = await to_thread.run_sync(store.job_row, job_id)
            cached = bool(self.cache if row.cache is None else row.cache)
            provider = await self.cached_provider() if cached else self._provider
            with running.scope:
                ran = await help_run(store, provider, job_id, self.owner)
            logger.info("batch %s: helping pass ended (ran lines: %s, stopped: %s)", job_id, ran,
                        running.scope.cancel_called)  # fmt: skip
        except Exception as exc:  # its owner runs the batch on: never fail it from here
            if not _lease_lost(exc):
                logger.warning("batch %s: helping its owner stopped: %s", job_id, exc)
        finally:
            if not ran:
                self._idle_help[job_id] = time.monotonic()
            self._helping.pop(job_id, None)

    def _start(self, job_id: str) -> None:
        assert self._tg is not None and self._provider is not None
        running = RunningJob(job_id)
        self._running[job_id] = running
        self._tg.start_soon(self._run, running)

    async def _run(self, running: RunningJob) -> None:
        assert self._store is not None and self._provider is not None
        store = self._store
        try:
            if self._runner is not None:
                await self._runner(store, running)
            else:
                row = await to_thread.run_sync(store.job_row, running.job_id)
                cached = bool(self.cache if row.cache is None else row.cache)
                provider = await self.cached_provider() if cached else self._provider
                await run_job(store, provider, running)
        except anyio.get_cancelled_exc_class():
            raise  # the client is closing: the job stays active, to be resumed
        except Exception as exc:  # a bug or a broken state dir: fail this job, not the client
            if running.lease_lost or _lease_lost(exc):
                logger.warning(
                    "batch %s: another process took it over; stopped here", running.job_id
                )
                return
            error = failure_of(exc, self.state_dir)
            logger.error("batch %s failed: %s: %s", running.job_id, error.code, error.message)
            with anyio.CancelScope(shield=True):
                failed_at = now()
                if not await self._record_failure(running.job_id, error, failed_at):
                    # a full disk: reported failed from memory, written at a later heartbeat
                    self._unrecorded[running.job_id] = (error, failed_at)
                    logger.error(
                        "batch %s: its failure cannot be recorded yet (%s); retrying every %g s",
                        running.job_id,
                        error.code,
                        self.lease_times.heartbeat_s,
                    )
        finally:
            # the lease goes first: whoever waited for the job may resume it at once
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await to_thread.run_sync(store.release, running.job_id, self.owner)
            self._running.pop(running.job_id, None)
            running.done.set()

    async def _record_failure(self, job_id: str, error: BatchError, failed_at: int) -> bool:
        """Write the batch's failure and free its lease; whether that could be written."""
        store = self._store
        assert store is not None
        try:
            await to_thread.run_sync(
                lambda: store.update_job(
                    job_id,
                    where_status=BatchStatus.ACTIVE,
                    where_owner=self.owner,  # not a batch another process has taken over
                    status="failed",
                    failed_at=failed_at,
                    errors=[error.model_dump(exclude_none=True)],
                    owner=None,  # the lease goes in the same write: a full disk may take only one
                )
            )
        except STORAGE_ERRORS:
            return False
        return True

    async def _heartbeat(self) -> None:
        store = self._store
        assert store is not None
        scanned = time.monotonic()
        while True:
            read = True
            # only jobs running before the read can have lost a lease it does not list (one
            # resumed or taken up meanwhile took its lease after the read began)
            running_before = dict(self._running)
            try:
                leases = await to_thread.run_sync(store.heartbeat, self.owner)
            except STORAGE_ERRORS:  # a full disk, say: the jobs report it themselves
                leases, read = [], False
            held = dict(leases)
            for job_id, status in leases:
                running = self._running.get(job_id)
                if status == "cancelling" and running is not None:
                    running.cancel_requested = True
                    running.scope.cancel()
            if read and self._helping:  # a helped batch that ends or is cancelled: stop
                try:
                    states = await to_thread.run_sync(store.statuses, list(self._helping))
                except STORAGE_ERRORS:
                    states = {}
                for job_id, status in states.items():
                    helper = self._helping.get(job_id)
                    if helper is not None and status != "in_progress":
                        helper.scope.cancel()
            if read and store.shared:  # (one process per SQLite file: its leases are its own)
                for job_id, running in running_before.items():
                    if (
                        job_id not in held
                        and not running.lease_lost
                        and self._running.get(job_id) is running
                    ):
                        # taken over by a process that found this one silent: stop at once
                        running.lease_lost = True
                        running.scope.cancel()
            for job_id, (error, failed_at) in list(self._unrecorded.items()):
                if await self._record_failure(job_id, error, failed_at):
                    self._unrecorded.pop(job_id, None)
                    logger.info("batch %s: its failure (%s) is recorded", job_id, error.code)
            if time.monotonic() - scanned >= self.lease_times.orphan_scan_s:
                scanned = time.monotonic()
                try:
                    await self._resume_orphans()
                except STORAGE_ERRORS:
                    pass  # the state directory is failing: the jobs report it themselves
                except Exception:  # never let the scan take the client down
                    logger.exception("looking for orphaned batches failed")
            await anyio.sleep(self.lease_times.heartbeat_s)

    # ------------------------------------------------------------------ jobs

    async def schedule(
        self,
        file_id: str,
        *,
        endpoint: str = Endpoint.chat_completions,
        completion_window: str = "24h",
        metadata: dict[str, str] | None = None,
        reuse_results_from: str | None = None,
        cache: bool | None = None,
        output_expires_after_s: int | None = None,
    ) -> Batch:
        """Create a batch over an uploaded file and start it; see :meth:`Batches.create`."""
        if output_expires_after_s is not None and (
            isinstance(output_expires_after_s, bool)
            or not isinstance(output_expires_after_s, int)
            or output_expires_after_s < 1
        ):
            raise ConfigurationError(
                f"output_expires_after_s must be a whole number of seconds >= 1, "
                f"not {output_expires_after_s!r}"
            )
        if self._provider is None:
            raise ConfigurationError("this job manager has no provider: it cannot run jobs")
        supported = sorted(e.value for e in self._provider.endpoints)
        if endpoint not in supported:
            raise ConfigurationError(
                f"endpoint {str(endpoint)!r} is not served by {self._provider_name()}; "
                f"supported: {', '.join(supported)}"
            )
        try:
            window_s = parse_window(completion_window)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        _check_metadata(metadata)
        store = await self.store()
        record = await self._call(store.get_file, file_id)
        if record.purpose != "batch":
            raise ConfigurationError(f"file {file_id} has purpose {record.purpose!r}, not 'batch'")
        if reuse_results_from is not None:
            seed = await self._call(store.job_row, reuse_results_from)
            same = await self._call(store.file_sha256, seed.input_file_id)
            if same != await self._call(store.file_sha256, file_id):
                raise ConfigurationError(
                    f"job {reuse_results_from} ran on different input content than {file_id}"
                )
        created = time.time()
        job_id = f"batch_{secrets.token_hex(12)}"
        await self._call(
            store.insert_job,
            {
                "id": job_id,
                "input_file_id": file_id,
                "endpoint": str(endpoint),
                "completion_window": completion_window,
                "status": "validating",
                "created_at": int(created),
                # rounded up: whole seconds (OpenAI's unit) never shorten the completion window
                "expires_at": math.ceil(created + window_s),
                "metadata": json.dumps(metadata) if metadata else None,
                "identity": self._identity,
                "seed_job_id": reuse_results_from,
                "cache": int(self.cache if cache is None else cache),
                "owner": self.owner,
                "heartbeat_at": store.db.now(),
                "owner_kernel": store.kernel,
                "output_expires_s": output_expires_after_s,
            },
        )
        self._start(job_id)
        return await self.info(job_id)

    async def info(self, job_id: str) -> Batch:
        store = await self.store()
        job: Batch = await self._call(store.get_job, job_id)
        return self._annotate(job)

    def _annotate(self, job: Batch) -> Batch:
        """``job`` as known here, with its progress (counted from its first committed result
        when it runs here)."""
        running = self._running.get(job.id)
        origin = running.origin if running is not None else None
        return self._progress.annotate(self._as_known(job), origin=origin)

    def _as_known(self, job: Batch) -> Batch:
        """``job`` as this manager knows it: ``failed`` when its failure is not written yet."""
        unrecorded = self._unrecorded.get(job.id)
        if unrecorded is None or job.status not in BatchStatus.ACTIVE:
            return job
        error, failed_at = unrecorded
        return job.model_copy(
            update={
                "status": "failed",
                "failed_at": failed_at,
                "errors": BatchErrors(data=[error]),
            }
        )

    async def status(self, job_id: str) -> JobStatus | None:
        if not Store.exists(self.state_dir):
            return None
        try:
            job = await self.info(job_id)
        except KeyError:
            return None
        return _STATUS_MAP[job.status]

    async def list(self, limit: int | None = None, after: str | None = None) -> list[Batch]:
        if not Store.exists(self.state_dir):
            return []
        store = await self.store()
        jobs: list[Batch] = await self._call(store.list_jobs, limit, after)
        return [self._annotate(job) for job in jobs]

    def is_running_here(self, job_id: str) -> bool:
        return job_id in self._running

    async def wait(self, job_id: str) -> Batch:
        """Wait until the job is terminal (``completed``, ``failed``, ``cancelled``,
        ``expired``); return it. Bound the wait with ``anyio.fail_after``."""
        while True:
            running = self._running.get(job_id)
            if running is not None:
                await running.done.wait()
            job = await self.info(job_id)  # failed, also when that could not be written yet
            if job.status not in BatchStatus.ACTIVE:
                return job
            if running is None:
                await anyio.sleep(0.2)

    async def cancel(self, job_id: str) -> None:
        """Cancel a job; see ``BaseBatchClient.job_cancel``."""
        store = await self.store()
        row = await self._call(store.job_row, job_id)
        if row.status == "cancelled":
            return
        if row.status not in ("validating", "in_progress", "cancelling"):
            raise JobStateError(
                f"job {job_id} is {row.status}: only a validating or in-progress job can be "
                "cancelled"
            )
        changed = await self._call(
            store.update_job,
            job_id,
            where_status=("validating", "in_progress"),
            status="cancelling",
            cancelling_at=now(),
        )
        if not changed and (await self._call(store.job_row, job_id)).status not in (
            "cancelling",
            "cancelled",
        ):
            raise JobStateError(f"job {job_id} finished before it could be cancelled")
        running = self._running.get(job_id)
        if running is not None:
            running.cancel_requested = True
            running.scope.cancel()
            await running.done.wait()
            return
        # Not running here: its owner (another process) stops it at its next heartbeat, or,
        # when the owner is gone, we finish the cancellation ourselves.
        with anyio.fail_after(self.lease_times.lease_s * 3):
            while True:
                row = await self._call(store.job_row, job_id)
                if row.status not in BatchStatus.ACTIVE:
                    return
                if await self._call(self._orphaned, row) and await self._call(
                    store.claim, job_id, self.owner, row.owner
                ):
                    try:
                        await finalize(store, job_id, "cancelled")
                    finally:
                        await self._call(store.release, job_id, self.owner)
                    return
                await anyio.sleep(0.2)

    async def result(self, job_id: str) -> BatchResponse:
        """One response per input line, in input order, of the batch's endpoint's type; see
        ``BatchClient.job_result``."""
        store = await self.store()
        row = await self._call(store.job_row, job_id)
        status = row.status
        if status == "failed" and row.in_progress_at is None:
            errors = json.loads(row.errors or "[]")
            first = errors[0] if errors else {}
            detail = f"; first: {first.get('code')}: {first.get('message')}" if first else ""
            raise JobStateError(f"job {job_id} failed ({len(errors)} error(s){detail})")
        if status in BatchStatus.ACTIVE:
            raise JobStateError(f"job {job_id} is {status}; wait for it (job_wait) first")
        if status == "failed":  # after validation: every committed result, the rest as failed
            return await to_thread.run_sync(late_result, store, job_id)

        endpoint = Endpoint(row.endpoint)

        def build() -> list[Any]:
            return [response_for(r, endpoint) for r in store.iter_results(job_id)]

        batch = await to_thread.run_sync(build)
        if len(batch) != row.total:
            raise JobError(f"job {job_id} has {len(batch)} results for {row.total} lines")
        kind = _RESPONSES[endpoint]
        return kind(batch=batch)

    async def result_pages(
        self, job_id: str, size: int = 500, limiter: anyio.CapacityLimiter | None = None
    ) -> AsyncIterator[_Page]:
        """``result``'s items, ``size`` at a time, read from SQLite in a worker thread per page
        (memory flat, the event loop free; ``limiter`` bounds those threads). The state is
        checked before the first page: the errors ``result`` raises come from the first
        ``anext``. A stored result count that does not match the batch's lines raises
        ``JobError`` after the last page."""
        store = await self.store()
        row = await self._call(store.job_row, job_id)
        refused = row.status == "failed" and row.in_progress_at is None  # failed validation
        if refused or row.status in BatchStatus.ACTIVE:
            await self.result(job_id)  # raises its JobStateError
        if row.status == "failed":  # after validation: rare, and built whole as before
            late = await to_thread.run_sync(late_result, store, job_id)
            for start in range(0, len(late.batch), size):
                yield late.batch[start : start + size]
            return
        endpoint = Endpoint(row.endpoint)
        rows = store.iter_results(job_id)

        def page() -> _Page:
            return [response_for(r, endpoint) for r in itertools.islice(rows, size)]

        count = 0
        while items := await to_thread.run_sync(page, limiter=limiter):
            count += len(items)
            yield items
        if count != row.total:
            raise JobError(f"job {job_id} has {count} results for {row.total} lines")

    async def resume(self, job_id: str) -> Batch:
        """Take up a batch that failed after validation; see :meth:`Batches.resume`."""
        store = await self.store()
        row = await self._call(store.job_row, job_id)
        if self._provider is None:  # reopened with a free lease, for a manager that can run it
            if not await self._call(self._orphaned, row):
                raise JobStateError(f"job {job_id} is being run by another process")
            await self._call(reopen, store, job_id, None, row.owner)
            return await self.info(job_id)
        if row.identity != self._identity:
            raise ConfigurationError(
                f"job {job_id} ran on another provider ({row.identity}); resume it with a "
                "client like that one"
            )
        if job_id in self._unrecorded and not self.is_running_here(job_id):
            # failed here while its failure could not be written: it still holds our lease
            # and is active in the database; the disk has room again if this runs
            self._unrecorded.pop(job_id)
        else:
            ours = row.owner == self.owner and not self.is_running_here(job_id)
            if not ours and not await self._call(self._orphaned, row):
                raise JobStateError(f"job {job_id} is being run by another process")
            await self._call(reopen, store, job_id, self.owner, row.owner)
        self._start(job_id)
        return await self.info(job_id)

    async def write_lines(self, job_id: str, stream: IO[bytes]) -> None:
        """Write every finished line of the job (output and error lines, in input order) to a
        binary stream (``sys.stdout.buffer``), streamed from SQLite."""
        store = await self.store()
        await self._call(store.job_row, job_id)

        def dump() -> None:
            for line in iter_output_lines(store, job_id):
                stream.write(line)
            stream.flush()

        await to_thread.run_sync(dump)

    async def export(
        self, job_id: str, output: str | os.PathLike[str], errors: str | os.PathLike[str] | None
    ) -> None:
        """Write the job's finished lines in the OpenAI batch output format, in input order:
        successes to ``output`` and failures to ``errors``, or everything to ``output`` when
        ``errors`` is None. Each file is replaced atomically."""
        store = await self.store()
        await self._call(store.job_row, job_id)
        out, err = Path(output), Path(errors) if errors is not None else None
        if err is None:
            await to_thread.run_sync(write_lines, iter_output_lines(store, job_id), out)
            return
        await to_thread.run_sync(write_lines, iter_output_lines(store, job_id, ok=True), out)
        await to_thread.run_sync(write_lines, iter_output_lines(store, job_id, ok=False), err)

    async def totals(self) -> dict[str, StatusTotals]:
        """Per status: how many batches, and the sums of their request counts and tokens (one
        aggregate query; an empty dict before the state directory has a database)."""
        if not Store.exists(self.state_dir):
            return {}
        store = await self.store()
        sql = (
            "SELECT status, COUNT(*), SUM(completed), SUM(failed), SUM(cache_hits), "
            "SUM(input_tokens), SUM(output_tokens) FROM jobs GROUP BY status"
        )
        rows = await self._call(store.db.all, sql)
        return {str(r[0]): StatusTotals(*(int(x or 0) for x in tuple(r)[1:])) for r in rows}


class StatusTotals(NamedTuple):
    """The batches in one status (:meth:`JobManager.totals`): ``completed`` includes
    ``cache_hits``; tokens are those generated for them (not the cache's)."""

    batches: int
    completed: int
    failed: int
    cache_hits: int
    input_tokens: int
    output_tokens: int


def _check_metadata(metadata: dict[str, str] | None) -> None:
    """OpenAI's limits: at most 16 pairs, keys up to 64 and values up to 512 characters."""
    if metadata is None:
        return
    if len(metadata) > 16:
        raise ConfigurationError("metadata has more than 16 pairs")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigurationError("metadata keys and values must be strings")
        if len(key) > 64 or len(value) > 512:
            raise ConfigurationError(f"metadata {key[:64]!r}: key over 64 or value over 512 chars")


def _sweep(store: Store) -> None:
    """Remove what SIGKILL left behind: temporary files no live writer holds, and the lock
    files of dead owners (blocking)."""
    count, size = sweep_temporary(store)
    if count:
        logger.info("removed %d stale temporary file(s), %d bytes, from files/", count, size)
    sweep_owner_locks(store.state_dir)


def _pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists and is not a zombie (Linux: /proc)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


class Batches:
    """``client.batches``: OpenAI-style batches over uploaded files (``/v1/batches`` in spirit).

    Every method needs the owning client (or job manager) to be open (else
    ``ClientClosedError``); an unknown id raises ``JobNotFoundError``.
    """

    def __init__(self, manager: Callable[[], JobManager]) -> None:
        self._manager = manager

    async def create(
        self,
        input_file_id: str,
        *,
        endpoint: str = Endpoint.chat_completions,
        **options: Unpack[BatchOptions],
    ) -> Batch:
        """Validate an uploaded OpenAI batch JSONL file and run it in the background.

        Returns at once with the batch (status ``validating``); it runs inside the client's
        ``async with`` block (leaving the block pauses it; the next client on the same state
        directory and provider resumes it). Validation is all-or-nothing: a bad file gives a
        ``failed`` batch whose ``errors`` list each bad line (OpenAI codes, 1-based physical
        line, ``param``). ``options``: see :class:`~batchclient.types.BatchOptions`.

        Raises:
            FileNotFoundInStoreError: unknown ``input_file_id``.
            JobNotFoundError: unknown ``reuse_results_from``.
            ConfigurationError: bad completion window or metadata, a file that is not ``batch``, an
                endpoint the provider does not serve, or a ``reuse_results_from`` batch over
                other content.
        """
        return await self._manager().schedule(input_file_id, endpoint=endpoint, **options)

    async def retrieve(self, batch_id: str) -> Batch:
        """The batch record: status, timestamps (unix seconds), request counts (they only
        grow), validation errors, output and error file ids, token usage."""
        return await self._manager().info(batch_id)

    async def list(self, *, limit: int | None = None, after: str | None = None) -> list[Batch]:
        """The batches of the state directory, newest first: at most ``limit``, starting after
        the batch ``after`` (exclusive; OpenAI's cursor)."""
        return await self._manager().list(limit, after)

    async def wait(self, batch_id: str) -> Batch:
        """Wait until the batch is ``completed``, ``failed``, ``cancelled`` or ``expired`` and
        return it (bound the wait with ``anyio.fail_after``)."""
        return await self._manager().wait(batch_id)

    async def cancel(self, batch_id: str) -> Batch:
        """Cancel a batch: in-flight requests are aborted (HTTP requests closed, engine
        requests aborted), every finished result is kept, the rest fail with
        ``batch_cancelled``. Returns once it is ``cancelled``. A batch running in another
        process is stopped by that process within about a second. Cancelling a cancelled batch
        does nothing.

        Raises:
            JobStateError: the batch is ``completed``, ``failed``, ``expired`` or
                ``finalizing`` (OpenAI answers 409).
        """
        manager = self._manager()
        await manager.cancel(batch_id)
        return await manager.info(batch_id)

    async def resume(self, batch_id: str) -> Batch:
        """Take up a batch that failed after validation (its output files could not be
        written, its state directory failed under it): it is ``in_progress`` again, sends only
        the requests without a result (none, when only the files failed), then writes its
        files. ``batchclient run`` does this when run again. Returns the batch.

        A job manager without a provider (``batchclient jobs resume``) only makes it
        ``in_progress`` with a free lease: a client with the batch's provider that is open on
        the state directory (``batchclient serve``) takes it up within a few seconds, else the
        next one opened does.

        Raises:
            JobStateError: the batch did not fail after validation, or another process runs it.
            ConfigurationError: it ran on a provider with another identity.
        """
        return await self._manager().resume(batch_id)

    @property
    def recovered(self) -> tuple[str, ...]:
        """The ids of the batches the client took back up from a process that ended: those
        found on opening (running before ``async with`` returned), then any found later."""
        return tuple(self._manager().recovered)

    async def totals(self) -> dict[str, StatusTotals]:
        """Per status, the number of batches and the sums of their request counts and tokens
        (:class:`StatusTotals`), from one query (cheap for thousands of batches)."""
        return await self._manager().totals()

    def running_here(self, batch_id: str) -> bool:
        """Whether this client (this process) is running the batch right now."""
        return self._manager().is_running_here(batch_id)

    async def export(
        self,
        batch_id: str,
        output: str | os.PathLike[str],
        errors: str | os.PathLike[str] | None = None,
    ) -> None:
        """Write the batch's finished lines in the OpenAI batch output format, in input order:
        successes to ``output`` and failures to ``errors``, or every line to ``output`` when
        ``errors`` is None. Each file is replaced atomically."""
        await self._manager().export(batch_id, output, errors)


def _lease_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is (or a task group's group holds) :class:`LeaseLostError`."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(LeaseLostError) is not None
    return isinstance(exc, LeaseLostError)
