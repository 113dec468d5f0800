"""How a local job runs on a provider's batch API through a :class:`RemoteBatchBackend`.

The same durable flow as :class:`~._runner.RemoteRunner` (whose splitting, driving and stopping
it inherits), with a provider's own requests in place of an uploaded OpenAI file:

- ``planned`` -> the part's file is written (again, after a crash) through the backend's
  ``encode``; before the create goes out the part becomes ``uploaded`` with
  ``input_file_id = "create@<unix time>"`` (no file is uploaded: the column keeps when the
  create was sent), so a client that died before recording the answer asks ``find`` first;
- ``submitted`` -> polled (failures back off, ``Retry-After`` first, without limit) until
  ``ended``; then the results are read and committed.

Resubmission: requests that come back expired, cancelled by someone other than this client, or
with a retryable error are left unfinished and go, in a new part over the same input range, into
a new remote batch, until ``max_attempts`` batches have carried them; everything that succeeded
or failed for good is kept. A request is sent again only when its earlier batch said it was not
run or failed retryably.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import anyio
from anyio import to_thread

from .._core.provider import Provider
from ._backend import RemoteBatchBackend, RemoteState, wire_id
from ._parts import Part, collect, fail_part, part_lines, rewrite_part
from ._retry import ApiError
from ._runner import RemoteRunner, RunSettings, _Job

_SENT = "create@"


class BackendRunner(RemoteRunner):
    """Runs (or resumes) one local job on ``backend``. ``max_attempts``: the most remote batches
    one request is sent in (1: never resubmitted)."""

    def __init__(
        self,
        backend: RemoteBatchBackend,
        provider: Provider,
        settings: RunSettings,
        max_attempts: int = 3,
        on_expired: Provider | None = None,
    ) -> None:
        super().__init__(None, provider, settings, on_expired)  # type: ignore[arg-type]
        self.backend = backend
        self.max_attempts = max_attempts
        self.encoder = backend.encode

    async def _drive_once(self, job: _Job, part: Part, path: Path | None) -> Part | None:
        if part.state in ("planned", "uploaded"):
            written = path is not None and await anyio.Path(path).exists()
            if not written:  # after a crash, or a resubmission: what is left of its range
                path = job.tmp("part", part.part)
            assert path is not None
            try:
                if written:
                    lines = await to_thread.run_sync(_count_lines, path)
                else:
                    lines = await to_thread.run_sync(
                        rewrite_part, job.store, job.id, job.input, part, job.endpoint, path,
                        self.encoder,
                    )  # fmt: skip
                if lines == 0:  # everything in its range finished (or was refused) meanwhile
                    await job.update(part, state="collected")
                    return None
                remote_id = await self._submit_part(job, part, path, lines)
            finally:
                if not written:
                    await anyio.Path(path).unlink(missing_ok=True)
            await job.update(
                part, state="submitted", batch_id=remote_id, remote_status="in_progress"
            )
        state = await self._wait_backend(job, part)
        return await self._collect_backend(job, part, state)

    async def _submit_part(self, job: _Job, part: Part, path: Path, lines: int) -> str:
        """Create the part's remote batch, at most once: after a failure that may have created
        it (no answer, or a 5xx), or a crash after sending, look for it before trying again."""
        marks = self._marks(job, part)
        sent = part.input_file_id or ""
        search = sent.startswith(_SENT)
        since = float(sent[len(_SENT) :]) if search else time.time()
        async for attempt in self.backend.retrier.attempts():
            with attempt:
                if search:
                    found = await self.backend.find(marks, lines, since)
                    if found is not None:
                        return found
                await job.update(part, state="uploaded", input_file_id=f"{_SENT}{since:.3f}")
                try:
                    return await self.backend.submit(path, lines, marks)
                except ApiError as exc:
                    search = exc.status != 429  # a 429 created nothing
                    raise
        raise AssertionError("unreachable: tenacity either returns or reraises")

    async def _wait_backend(self, job: _Job, part: Part) -> RemoteState:
        assert part.batch_id is not None
        batch_id = part.batch_id
        while True:
            state = await self.backend.retrier.call(
                lambda: self.backend.poll(batch_id), forever=True
            )
            seen = (state.completed, state.failed, state.status)
            if (part.completed, part.failed, part.remote_status) != seen:
                await job.update(
                    part, completed=state.completed, failed=state.failed,
                    remote_status=state.status,
                )  # fmt: skip
            if state.ended:
                return state
            await anyio.sleep(self.backend.poll_interval_s)

    async def _collect_backend(self, job: _Job, part: Part, state: RemoteState) -> Part | None:
        """Commit an ended batch's results; return the part that carries what is left to
        resubmit, if anything and attempts are left."""
        assert part.batch_id is not None
        batch_id = part.batch_id
        again = part.attempt < self.max_attempts and not job.stopping
        dest = job.tmp("download", part.part)
        try:
            await self.backend.retrier.call(lambda: self.backend.results(batch_id, dest))
            store = job.store
            left = await to_thread.run_sync(
                lambda: collect(
                    store, job.id, job.input, part, [dest], complete=not state.partial,
                    wire_id=wire_id,
                    defer_retryable=again,
                )
            )  # fmt: skip
        finally:
            await anyio.Path(dest).unlink(missing_ok=True)
        if state.cancelled and not job.stopping and not again:
            job.remote_cancelled = True
        await job.update(part, state="collected")
        if not left or not again:
            return None
        nxt = Part(job.id, job.next_part, part.first_seq, part.count, attempt=part.attempt + 1)
        job.next_part += 1
        await to_thread.run_sync(
            job.ids.add_part, job.id, nxt.part, nxt.first_seq, nxt.count, nxt.attempt
        )
        return nxt

    async def _stop_one(self, job: _Job, part: Part) -> None:
        if part.state == "uploaded":  # a create may have gone out: find it, or there is none
            sent = part.input_file_id or ""
            since = float(sent[len(_SENT) :]) if sent.startswith(_SENT) else 0.0
            store = job.store
            lines = await to_thread.run_sync(
                lambda: sum(1 for _ in part_lines(store, job.id, job.input, part))
            )
            with contextlib.suppress(ApiError):
                found = await self.backend.find(self._marks(job, part), lines, since)
                if found is None:
                    await job.update(part, state="collected")
                    return
                await job.update(part, state="submitted", batch_id=found)
        if part.batch_id is None:
            await job.update(part, state="collected")
            return
        batch_id = part.batch_id
        if part.remote_status != "ended":  # an ended batch is only collected (again)
            with contextlib.suppress(ApiError):  # one that ended meanwhile may refuse
                await self.backend.retrier.call(lambda: self.backend.cancel(batch_id))
        try:
            state = await self._wait_backend(job, part)
            await self._collect_backend(job, part, state)
        except ApiError as exc:
            await to_thread.run_sync(
                fail_part, job.store, job.id, job.input, part, str(exc), exc.status
            )
            await job.update(part, state="collected")


def _count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)
