"""How a local job runs on a remote Batch API: split, upload, create, poll, collect.

The local job (a ``jobs`` row over a file in the state directory) owns its remote batches: each
is a ``remote_parts`` row, written before the remote call that gives it an id and updated right
after, so a client that died at any point picks up where it was on the next ``async with``:

- ``planned`` -> the part's file is written again from the input and uploaded;
- ``uploaded`` -> the remote batch list is searched for a batch over that file carrying the
  part's metadata (``batchclient_job``, ``batchclient_part``) before one is created: a create
  whose answer was lost is never repeated;
- ``submitted`` -> polled again; ``collected`` -> nothing to do.

Remote outcomes: ``completed``, ``expired`` and ``cancelled`` batches are downloaded and their
lines committed (an expired or cancelled batch's unrun lines stay unfinished: re-run live with
``on_expired``, else ``batch_expired`` / ``batch_cancelled``); a ``failed`` batch's validation
errors go to their lines, and its other lines are submitted once more in a new batch.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio import to_thread

from .._core.provider import Provider
from ..jobs import JobRow, RunningJob, Store, finalize, run_unfinished, validate_job
from ..types import BatchStatus
from ._api import BatchAPI, RemoteBatch
from ._parts import (
    Encoder,
    Limits,
    LineCursor,
    Part,
    RemoteIds,
    collect,
    fail_lines,
    fail_part,
    openai_line,
    rewrite_part,
    write_part,
)
from ._retry import ApiError

JOB_MARK = "batchclient_job"
PART_MARK = "batchclient_part"


@dataclass(frozen=True)
class RunSettings:
    """``limits``: split limits; ``poll_interval_s``: seconds between two polls of a remote
    batch; ``grace_s``: how long past the local job's ``expires_at`` the remote batches are
    waited for before they are cancelled and the job expires (remote batches are created a
    little after the local job, so they expire a little later)."""

    limits: Limits
    poll_interval_s: float
    grace_s: float = 600.0


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

    async def update(self, part: Part, **fields: Any) -> None:
        for key, value in fields.items():
            setattr(part, key, value)
        await to_thread.run_sync(lambda: self.ids.update_part(self.id, part.part, **fields))


class RemoteRunner:
    """The job runner of a ``BatchAPIBatchInference``: runs (or resumes) one local job on the
    remote API. ``provider`` checks the model at validation; ``on_expired`` (a provider, or
    None) re-runs the lines a remote batch did not run before it expired."""

    def __init__(
        self,
        api: BatchAPI,
        provider: Provider,
        settings: RunSettings,
        on_expired: Provider | None = None,
    ) -> None:
        self.api = api
        self.provider = provider
        self.settings = settings
        self.on_expired = on_expired
        self.encoder: Encoder = openai_line
        """How an input line becomes a line of a part's file."""

    async def __call__(self, store: Store, running: RunningJob) -> None:
        job_id = running.job_id
        row = await to_thread.run_sync(store.job_row, job_id)
        job = _Job(store, job_id, row)
        remaining = float(row.expires_at or 0) - time.time() + self.settings.grace_s
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
            if self.on_expired is not None:
                await run_unfinished(store, self.on_expired, job_id, row)
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
        try:
            while True:
                number = job.next_part
                path = job.tmp("part", number)
                plan = await to_thread.run_sync(
                    write_part, cursor, job.store, job.id, job.endpoint, self.settings.limits,
                    path, self.encoder,
                )  # fmt: skip
                if plan is None:
                    await anyio.Path(path).unlink(missing_ok=True)
                    return
                job.next_part += 1
                part = Part(job.id, number, plan.first_seq, plan.count)
                await to_thread.run_sync(
                    job.ids.add_part, job.id, number, plan.first_seq, plan.count, 1
                )
                if plan.lines == 0:  # everything in range already finished
                    await anyio.Path(path).unlink(missing_ok=True)
                    await job.update(part, state="collected")
                    continue
                tg.start_soon(self._drive, job, part, path)
        finally:
            cursor.close()

    async def _drive(self, job: _Job, part: Part, path: Path | None) -> None:
        """Take one part (and its resubmission, if any) to ``collected``."""
        current: Part | None = part
        while current is not None:
            this = current
            try:
                current = await self._drive_once(job, this, path)
            except ApiError as exc:  # given up on: its lines fail, the other parts go on
                await to_thread.run_sync(
                    fail_part, job.store, job.id, job.input, this, str(exc), exc.status
                )
                await job.update(this, state="collected")
                current = None
            finally:
                if path is not None:
                    await anyio.Path(path).unlink(missing_ok=True)
                path = None

    async def _drive_once(self, job: _Job, part: Part, path: Path | None) -> Part | None:
        resumed = part.state == "uploaded"
        if part.state == "planned":
            if path is None or not await anyio.Path(path).exists():
                path = job.tmp("part", part.part)
                await to_thread.run_sync(
                    rewrite_part, job.store, job.id, job.input, part, job.endpoint, path
                )
            file_id = await self.api.upload(path, f"{job.id}-part{part.part}.jsonl")
            await job.update(part, state="uploaded", input_file_id=file_id)
        if part.state == "uploaded":
            batch = await self._submit(job, part, search_first=resumed)
            await job.update(
                part, state="submitted", batch_id=batch.id, remote_status=batch.status.value
            )
        batch = await self._wait(job, part)
        return await self._collect(job, part, batch)

    def _marks(self, job: _Job, part: Part) -> dict[str, str]:
        return {JOB_MARK: job.id, PART_MARK: str(part.part)}

    async def _submit(self, job: _Job, part: Part, *, search_first: bool) -> RemoteBatch:
        """Create the part's remote batch, at most once: after a failure that may have created
        it (no answer, or a 5xx), look for it before trying again."""
        assert part.input_file_id is not None
        marks = self._marks(job, part)
        search = search_first
        async for attempt in self.api.retrier.attempts():
            with attempt:
                if search:
                    found = await self.api.find(part.input_file_id, marks)
                    if found is not None:
                        return found
                try:
                    return await self.api.create(
                        part.input_file_id, job.endpoint, job.window, marks
                    )
                except ApiError as exc:
                    search = exc.status != 429  # a 429 created nothing
                    raise
        raise AssertionError("unreachable: tenacity either returns or reraises")

    async def _wait(self, job: _Job, part: Part) -> RemoteBatch:
        """Poll until the remote batch is terminal, recording its request counts. Polling
        failures back off (``Retry-After`` first) without limit: the remote batch runs on."""
        assert part.batch_id is not None
        while True:
            batch = await self.api.retrieve(part.batch_id, forever=True)
            counts = batch.request_counts
            done = (counts.completed, counts.failed) if counts else (0, 0)
            if (part.completed, part.failed, part.remote_status) != (*done, batch.status.value):
                await job.update(
                    part, completed=done[0], failed=done[1], remote_status=batch.status.value
                )
            if batch.terminal:
                return batch
            await anyio.sleep(self.settings.poll_interval_s)

    async def _collect(self, job: _Job, part: Part, batch: RemoteBatch) -> Part | None:
        """Commit a terminal batch's lines; return the part to submit next (a failed batch's
        valid lines), if any."""
        store = job.store
        if batch.status == BatchStatus.failed:
            errors = batch.errors.data if batch.errors else []
            retry = part.attempt == 1 and any(e.line is not None for e in errors)
            left = await to_thread.run_sync(
                lambda: fail_lines(
                    store, job.id, job.input, part, errors, batch_id=batch.id, fill_rest=not retry
                )
            )
            await job.update(part, state="collected")
            if not left:
                return None
            again = Part(job.id, job.next_part, part.first_seq, part.count, attempt=2)
            job.next_part += 1
            await to_thread.run_sync(
                job.ids.add_part, job.id, again.part, again.first_seq, again.count, 2
            )
            return again
        files: list[Path] = []
        try:
            for file_id in (batch.output_file_id, batch.error_file_id):
                if file_id:
                    dest = job.tmp("download", part.part)
                    files.append(dest)
                    await self.api.download(file_id, dest)
            complete = batch.status == BatchStatus.completed
            await to_thread.run_sync(
                lambda: collect(store, job.id, job.input, part, files, complete=complete)
            )
        finally:
            for f in files:
                await anyio.Path(f).unlink(missing_ok=True)
        if batch.status == BatchStatus.cancelled and not job.stopping:
            job.remote_cancelled = True
        await job.update(part, state="collected")
        return None

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
        if part.state == "uploaded":
            assert part.input_file_id is not None
            with contextlib.suppress(ApiError):
                found = await self.api.find(part.input_file_id, self._marks(job, part))
                if found is None:
                    await job.update(part, state="collected")
                    return
                await job.update(part, state="submitted", batch_id=found.id)
        assert part.batch_id is not None
        with contextlib.suppress(ApiError):  # a batch that already finished refuses (409)
            await self.api.cancel(part.batch_id)
        try:
            batch = await self._wait(job, part)
            await self._collect(job, part, batch)
        except ApiError as exc:
            await to_thread.run_sync(
                fail_part, job.store, job.id, job.input, part, str(exc), exc.status
            )
            await job.update(part, state="collected")
