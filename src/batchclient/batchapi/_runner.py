"""How a local job runs on a remote batch API (a :class:`~._backend.RemoteBatchBackend`): split,
upload, create, poll, collect, resubmit. One runner for every backend.

The local job (a ``jobs`` row over a file in the state directory) owns its remote batches: each
is a ``remote_parts`` row, written before the remote call that gives it an id and updated right
after, so a client that died at any point picks up where it was on the next ``async with``:

- ``planned`` -> the part's file is written (again, after a crash) through the backend's
  ``encode`` and uploaded where the backend needs that (``input_file_id``) -> ``uploaded``;
- ``uploaded`` -> ``sent_at`` is recorded before the first create goes out; a part that has one
  (its create may have been made and its answer lost) looks for its batch (``find``) before it
  creates one, as does every retry after a failure that may have created it;
- ``submitted`` -> polled (failures back off, ``Retry-After`` first, without limit) until it
  ended; then its results are committed -> ``collected``.

Resubmission, one policy for every backend: a request its batch did not run (expired), or that
failed in a way a later batch may not (429, 5xx, overloaded, a batch that failed without naming
it), stays unfinished and goes, in a new part over the same input range, into a new remote
batch, until ``max_attempts`` batches have carried it. What was answered, or failed for good (a
validation error naming the request), is never sent again; a batch someone else cancelled is
not resubmitted (the job ends ``cancelled``). What is still not run when attempts run out is
re-run live by ``on_expired``, else ``batch_expired``.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from pathlib import Path
from typing import Any

import anyio
from anyio import to_thread

from ..jobs._runner import RunningJob, finalize, run_unfinished, validate_job
from ..jobs._store import JobRow, Store
from ._backend import RemoteState, chat_encoder
from ._collect import collect
from ._parts import LineCursor, Part, RemoteIds, fail_part, part_lines, rewrite_part, write_part
from ._provider import RemoteBatchProvider
from ._retry import ApiError

JOB_MARK = "batchclient_job"
PART_MARK = "batchclient_part"


class _Job:
    """The state of one job run: its ids, paths and the next free part number."""

    def __init__(self, store: Store, job_id: str, row: JobRow) -> None:
        self.store = store
        self.ids = RemoteIds(store)
        self.id = job_id
        self.input = store.file_path(row.input_file_id)
        self.endpoint = str(row.endpoint)
        self.window = str(row.completion_window)
        self.next_part = 0
        self.stopping = False  # we cancel the remote batches ourselves
        self.remote_cancelled = False  # someone else cancelled one

    def tmp(self, kind: str, part: int) -> Path:
        token = secrets.token_hex(4)
        return self.store.files_dir / f".{kind}-{self.id}-{part}-{token}.jsonl"

    def marks(self, part: Part) -> dict[str, str]:
        """What labels the part's remote batch (where the provider keeps labels)."""
        return {JOB_MARK: self.id, PART_MARK: str(part.part)}

    async def update(self, part: Part, **fields: Any) -> None:
        for key, value in fields.items():
            setattr(part, key, value)
        await to_thread.run_sync(lambda: self.ids.update_part(self.id, part.part, **fields))

    async def add(self, first_seq: int, count: int, attempt: int) -> Part:
        part = Part(self.id, self.next_part, first_seq, count, attempt=attempt)
        self.next_part += 1
        await to_thread.run_sync(self.ids.add_part, self.id, part.part, first_seq, count, attempt)
        return part


class RemoteRunner:
    """The job runner of a client over a remote batch API: runs (or resumes) one local job on
    ``provider``'s backend, with its options (``poll_interval_s``, ``expiry_grace_s``,
    ``max_attempts``), retrier and ``on_expired``."""

    def __init__(self, provider: RemoteBatchProvider) -> None:
        self.provider = provider
        self.backend = provider.backend
        self._encode = chat_encoder(provider.backend)
        self.retrier = provider.retrier
        self.options = provider.options

    async def __call__(self, store: Store, running: RunningJob) -> None:
        job_id = running.job_id
        row = await to_thread.run_sync(store.job_row, job_id)
        job = _Job(store, job_id, row)
        remaining = float(row.expires_at or 0) - time.time() + self.options["expiry_grace_s"]
        running.scope.deadline = anyio.current_time() + remaining
        with running.scope:
            if row.status == "validating" and not await validate_job(store, self.provider, job_id):
                return
            if row.status in ("validating", "in_progress"):
                await self._process(job)
        status = (await to_thread.run_sync(store.job_row, job_id)).status
        if running.cancel_requested or status == "cancelling":
            await self._stop_remote(job)
            await finalize(store, job_id, "cancelled")
            return
        if running.scope.cancelled_caught:  # past the window (and its grace)
            await self._stop_remote(job)
        row = await to_thread.run_sync(store.job_row, job_id)
        if row.total > row.completed + row.failed:
            if job.remote_cancelled:
                await finalize(store, job_id, "cancelled")
                return
            if self.provider.on_expired is not None:
                await run_unfinished(store, self.provider.on_expired, job_id, row)
            else:
                await finalize(store, job_id, "expired")
                return
        await finalize(store, job_id, "completed")

    async def _parts(self, job: _Job) -> list[Part]:
        parts = await to_thread.run_sync(job.ids.parts, job.id)
        job.next_part = max((p.part for p in parts), default=-1) + 1
        return parts

    # ------------------------------------------------------------------ splitting and driving

    async def _process(self, job: _Job) -> None:
        parts = await self._parts(job)
        total = (await to_thread.run_sync(job.store.job_row, job.id)).total
        start = max((p.first_seq + p.count for p in parts), default=0)
        async with anyio.create_task_group() as tg:
            for part in parts:
                if part.state != "collected":
                    tg.start_soon(self._drive, job, part, None)
            if start < total:
                await self._plan(job, start, tg)

    async def _plan(self, job: _Job, start: int, tg: Any) -> None:
        """Write parts from input line ``start`` on; start driving each as soon as it is
        written, so its upload overlaps the writing of the next."""
        cursor = await to_thread.run_sync(LineCursor, job.input, start)
        with contextlib.closing(cursor):
            while True:
                path = job.tmp("part", job.next_part)
                plan = await to_thread.run_sync(
                    write_part, cursor, job.store, job.id, job.endpoint, self.backend.limits,
                    path, self._encode,
                )  # fmt: skip
                if plan is None:
                    await anyio.Path(path).unlink(missing_ok=True)
                    return
                part = await job.add(plan.first_seq, plan.count, 1)
                tg.start_soon(self._drive, job, part, (path, plan.lines))

    async def _drive(self, job: _Job, part: Part, file: tuple[Path, int] | None) -> None:
        """Take one part (and its resubmissions) to ``collected``. ``file``: its file as just
        written and its number of lines (None: written again from its range)."""
        current: Part | None = part
        while current is not None:
            try:
                again = await self._drive_once(job, current, file)
            except ApiError as exc:  # given up on: its lines fail, the other parts go on
                await self._fail(job, current, exc)
                return
            current, file = again, None

    async def _drive_once(
        self, job: _Job, part: Part, file: tuple[Path, int] | None
    ) -> Part | None:
        if part.state in ("planned", "uploaded"):
            path = job.tmp("part", part.part) if file is None else file[0]
            try:
                if file is None:  # after a crash, or a resubmission: what is left of its range
                    lines = await to_thread.run_sync(
                        rewrite_part, job.store, job.id, job.input, part, job.endpoint, path,
                        self._encode, self.backend.limits.max_bytes,
                    )  # fmt: skip
                else:
                    lines = file[1]
                if lines == 0:  # everything in its range finished (or was refused) meanwhile
                    await job.update(part, state="collected")
                    return None
                if part.state == "planned":
                    marks, upload = job.marks(part), self.backend.upload
                    uploaded = await self.retrier.call(lambda: upload(path, lines, marks))
                    await job.update(part, state="uploaded", input_file_id=uploaded)
                remote_id = await self._submit(job, part, path, lines)
            finally:
                await anyio.Path(path).unlink(missing_ok=True)
            await job.update(
                part, state="submitted", batch_id=remote_id, remote_status="in_progress"
            )
        state = await self._wait(job, part)
        return await self._collect(job, part, state)

    async def _fail(self, job: _Job, part: Part, exc: ApiError) -> None:
        """Every unfinished line of the part fails with ``exc``; it is collected."""
        await to_thread.run_sync(
            fail_part, job.store, job.id, job.input, part, str(exc), exc.status
        )
        await job.update(part, state="collected")

    async def _submit(self, job: _Job, part: Part, path: Path, lines: int) -> str:
        """Create the part's remote batch, at most once: after a failure that may have created
        it (no answer, a 5xx) or a crash after its create went out, look for it first."""
        search = part.sent_at is not None
        if not search:
            await job.update(part, sent_at=time.time())
        marks, since = job.marks(part), part.sent_at or 0.0
        async for attempt in self.retrier.attempts():
            with attempt:
                if search:
                    found = await self.backend.find(part.input_file_id, marks, lines, since)
                    if found is not None:
                        return found
                try:
                    return await self.backend.submit(
                        part.input_file_id, path, job.endpoint, job.window, marks
                    )
                except ApiError as exc:
                    search = exc.status != 429  # a 429 created nothing
                    raise
        raise AssertionError("unreachable: tenacity either returns or reraises")

    async def _wait(self, job: _Job, part: Part) -> RemoteState:
        """Poll until the remote batch ended, recording its request counts. Polls back off
        (``Retry-After`` first) without limit: the remote batch runs on."""
        assert part.batch_id is not None
        batch_id, poll = part.batch_id, self.backend.poll
        while True:
            state = await self.retrier.call(lambda: poll(batch_id), forever=True)
            seen = (state.completed, state.failed, state.status)
            if (part.completed, part.failed, part.remote_status) != seen:
                await job.update(
                    part, completed=state.completed, failed=state.failed,
                    remote_status=state.status,
                )  # fmt: skip
            if state.ended:
                return state
            await anyio.sleep(self.options["poll_interval_s"])

    async def _collect(self, job: _Job, part: Part, state: RemoteState) -> Part | None:
        """Commit an ended batch's results; return the part that carries what is left to
        resubmit, if anything is and attempts are left."""
        assert part.batch_id is not None
        batch_id, results = part.batch_id, self.backend.results
        again = (
            part.attempt < self.options["max_attempts"] and not job.stopping and not state.cancelled
        )
        dest = job.tmp("download", part.part)
        try:
            await self.retrier.call(lambda: results(batch_id, dest))
            store, wire_id = job.store, self.backend.wire_id
            left = await to_thread.run_sync(
                lambda: collect(
                    store, job.id, job.input, part, dest, wire_id=wire_id,
                    complete=not state.partial, resubmit=again,
                )
            )  # fmt: skip
        finally:
            await anyio.Path(dest).unlink(missing_ok=True)
        if state.cancelled and not job.stopping:
            job.remote_cancelled = True
        await job.update(part, state="collected")
        if not left or not again:
            return None
        return await job.add(part.first_seq, part.count, part.attempt + 1)

    # ------------------------------------------------------------------ cancel / stop

    async def _stop_remote(self, job: _Job) -> None:
        """Cancel every remote batch of the job that is still running, wait for each to stop
        and keep what it finished. A batch whose create answer was lost is found first."""
        job.stopping = True
        parts = [p for p in await self._parts(job) if p.state in ("uploaded", "submitted")]
        async with anyio.create_task_group() as tg:
            for part in parts:
                tg.start_soon(self._stop_one, job, part)

    async def _stop_one(self, job: _Job, part: Part) -> None:
        if part.state == "uploaded":  # a create may have gone out: find it, or there is none
            found = None
            if part.sent_at is not None:
                store = job.store
                lines = await to_thread.run_sync(
                    lambda: sum(1 for _ in part_lines(store, job.id, job.input, part))
                )
                with contextlib.suppress(ApiError):
                    found = await self.backend.find(
                        part.input_file_id, job.marks(part), lines, part.sent_at
                    )
            if found is None:
                await job.update(part, state="collected")
                return
            await job.update(part, state="submitted", batch_id=found)
        assert part.batch_id is not None
        batch_id, cancel = part.batch_id, self.backend.cancel
        if part.remote_status != "ended":  # an ended batch is only collected (again)
            with contextlib.suppress(ApiError):  # one that ended meanwhile may refuse
                await self.retrier.call(lambda: cancel(batch_id))
        try:
            state = await self._wait(job, part)
            await self._collect(job, part, state)
        except ApiError as exc:
            await self._fail(job, part, exc)
