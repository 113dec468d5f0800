"""One job's life in the background: validating -> in_progress -> finalizing -> completed (or
failed, cancelled, expired), through the same primitive as ``batch_chat_completion``:
``run_requests(provider.execute, <requests read lazily from the input file>, max_in_flight,
on_result)``.

Durability: a worker hands its result to :class:`GroupCommit` and waits until the SQLite
transaction holding it has committed before it takes the next request. So a request is either
durable or still in flight, and a crash re-sends at most ``provider.max_in_flight()`` requests
on resume. Results that complete while a commit runs are committed together (group
commit), so the write rate follows the result rate without one transaction per result.

Identical deterministic lines are sent once (:mod:`._plan`): the lines merged into a sent one
are committed in the same transaction as its result (up to :data:`_FEW_MERGED`; more right
after it, in chunks, and on resume if a crash came between). Writing the output files is retried
(:data:`WRITE_RETRY`); when it still fails the job is ``failed`` with ``output_write_failed``,
every result stays committed, and :meth:`JobManager.resume` finishes it without sending a
finished request.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.lowlevel
from anyio import to_thread
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from .._core.flows import batch_flow
from .._core.prefix import mark_shared_prefixes
from .._core.provider import Provider
from .._core.request import Request, Result, failed
from .._core.scheduler import run_requests
from ..errors import ErrorCode, ModelNotFoundError
from ..types import BatchError, BatchStatus, Endpoint
from ._output import (
    OutputWriteError,
    merged_row,
    request_for,
    row_for,
    with_line,
    write_job_files,
)
from ._plan import JobLinePlanner
from ._store import LeaseLostError, ResultRow, Store, now
from ._validate import RequestLine, iter_requests, validate_batch_file

_BLOCK = 256  # input lines parsed per thread hop
_FEW_MERGED = 64
"""Lines merged into one request that are committed with its result, in the event loop; more
are written after it in a worker thread, :data:`_MERGED_CHUNK` per transaction, so that one
request with a million copies neither holds their rows in memory nor stalls the loop."""
_MERGED_CHUNK = 2000
SHARED_POLL_S = 1.0
"""How often the owner of a shared job looks again for blocks other processes hold."""


@dataclass(frozen=True)
class WriteRetry:
    """How often writing a job's output files is tried (``attempts``), with exponential
    backoff from ``initial_s`` up to ``max_s`` seconds between tries (a full disk or a busy
    network file system may recover within seconds)."""

    attempts: int = 5
    initial_s: float = 0.1
    max_s: float = 2.0


WRITE_RETRY = WriteRetry()
"""The policy :func:`finalize` uses (five tries within about 1.5 s)."""


@dataclass
class RunningJob:
    """A job running in this process. ``scope`` is cancelled by ``job_cancel`` (with
    ``cancel_requested``) and by its completion window (its deadline). ``origin``: when this
    process committed its first result (unix seconds, to the microsecond) and how many lines
    were finished then: where its progress rate starts, past the start-up and the first
    requests' latency (``in_progress_at`` is whole seconds, and before both)."""

    job_id: str
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)
    cancel_requested: bool = False
    origin: tuple[float, int] | None = None
    lease_lost: bool = False
    """Another process took the job over (its heartbeat saw the lease gone): stop, finish
    nothing."""


class RequestSource:
    """The job's unfinished requests, read lazily from its input file (a block of lines per
    thread hop; the finished ``seq``s of each block looked up in SQLite), so memory stays flat and
    a resumed job skips what is done."""

    def __init__(
        self,
        store: Store,
        job_id: str,
        path: Path,
        endpoint: Endpoint = Endpoint.chat_completions,
        claim: Callable[[int], bool] | None = None,
    ) -> None:
        self._store = store
        self._job_id = job_id
        self._endpoint = endpoint
        self._claim = claim
        self.skipped: list[int] = []
        """Blocks with unfinished lines that another process holds (with ``claim``)."""
        self.block_of: dict[int, int] = {}
        """``{seq of a request handed out: its block}`` (with ``claim``); the job pops an entry
        when that request's result arrives."""
        self._file: IO[bytes] = path.open("rb")
        self._lines: Iterator[RequestLine] = iter_requests(self._file)
        self._buffer: list[Request] = []
        self._exhausted = False
        self.merged: dict[int, list[tuple[int, str]] | None] = {}
        """``{seq of a request handed out: [(seq, custom_id) of the lines merged into it]}``
        (``None``: more than :data:`_FEW_MERGED`, read from the store when its answer comes);
        the job pops an entry when that request's result arrives."""

    def __aiter__(self) -> RequestSource:
        return self

    async def __anext__(self) -> Request:
        while not self._buffer:
            if self._exhausted:
                raise StopAsyncIteration
            self._buffer = await to_thread.run_sync(self._next_block)
            self._buffer.reverse()
        return self._buffer.pop()

    def _next_block(self) -> list[Request]:
        while True:
            block: list[RequestLine] = []
            for line in self._lines:
                block.append(line)
                if len(block) >= _BLOCK:
                    break
            if not block:
                self._exhausted = True
                return []
            lo, hi = block[0].seq, block[-1].seq
            done = self._store.finished_seqs(self._job_id, lo, hi)
            marks = self._store.job_lines(self._job_id, lo, hi)
            # merged: answered with its line
            unsent = [
                r for r in block if r.seq not in done and marks.get(r.seq, (None, 0))[0] is None
            ]
            if unsent and self._claim is not None:
                # the block's first seq names it alike in every process reading the file
                if not self._claim(lo):
                    self.skipped.append(lo)
                    continue
                self.block_of.update((r.seq, lo) for r in unsent)
            merged = self._store.merged_into(self._job_id, lo, hi, _FEW_MERGED) if unsent else {}
            todo = []
            for r in unsent:
                _, repeat = marks.get(r.seq, (None, 0))
                request = request_for(r.seq, r.custom_id, r.body, self._endpoint)
                request.repeat = repeat
                if r.seq in merged:
                    self.merged[r.seq] = merged[r.seq]
                todo.append(request)
            if todo:
                mark_shared_prefixes(todo)  # a block is the job's look-ahead window
                return todo

    def close(self) -> None:
        self._file.close()


class GroupCommit:
    """Commit finished rows to the store; ``put`` returns once the row's transaction
    committed."""

    def __init__(self, store: Store, job_id: str, running: RunningJob | None = None) -> None:
        self._store = store
        self._job_id = job_id
        self._running = running  # its origin is set at the first commit
        self._rows: list[ResultRow] = []
        self._blocks: set[int] = set()
        self._committed = anyio.Event()
        self._busy = False

    async def put(self, rows: list[ResultRow], block: int | None = None) -> None:
        """Queue ``rows`` (committed in one transaction); return once they are durable.
        ``block``: the block lease they were sent under, checked by the commit."""
        self._rows.extend(rows)
        if block is not None:
            self._blocks.add(block)
        if self._busy:  # the current committer takes this row in its next transaction
            await self._committed.wait()
            return
        self._busy = True
        try:
            while self._rows:
                # one loop turn: results that complete meanwhile join this transaction
                await anyio.lowlevel.checkpoint()
                if not self._store.shared:
                    self._commit()
                    continue
                # a shared database is round trips away: commit off the loop, and what
                # finishes meanwhile joins the next transaction
                rows, blocks, event = self._take()
                await to_thread.run_sync(self._write, rows, blocks)
                event.set()
        finally:
            self._busy = False

    def _take(self) -> tuple[list[ResultRow], set[int], anyio.Event]:
        rows, blocks, event = self._rows, self._blocks, self._committed
        self._rows, self._blocks, self._committed = [], set(), anyio.Event()
        return rows, blocks, event

    def _commit(self) -> None:
        # In the event loop, not a worker thread: a WAL commit without fsync takes ~0.1 ms,
        # while a thread hop waits for the GIL (up to its 5 ms switch interval) with the
        # worker's slot held (bench/jobs_throughput.py measured the difference).
        rows, blocks, event = self._take()
        self._write(rows, blocks)
        event.set()

    def _write(self, rows: list[ResultRow], blocks: set[int]) -> None:
        if rows:
            self._store.commit_results(self._job_id, rows, blocks)
            if self._running is not None and self._running.origin is None:
                job = self._store.job_row(self._job_id)
                self._running.origin = (time.time(), job.completed + job.failed)

    def flush(self) -> None:
        """Commit everything queued (after the run, also when it was cancelled)."""
        self._commit()


JobRunner = Callable[[Store, RunningJob], Awaitable[None]]
"""Runs (or resumes) one job to a terminal state, like :func:`run_job` (which runs it through a
provider's ``execute``); a client whose requests go elsewhere, such as a remote Batch API, gives
the job manager its own."""


MAX_WINDOW_S = 3650 * 86400.0
"""The longest completion window accepted (ten years)."""


def parse_window(window: str) -> float:
    """Seconds in a completion window: ``"24h"``, ``"30m"``, ``"5s"``, ``"2d"`` (a number and
    a unit, at most :data:`MAX_WINDOW_S`; OpenAI accepts only ``"24h"``). Raises ``ValueError``
    otherwise."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = window.strip().lower()
    try:
        value = float(text[:-1])
        seconds = value * units[text[-1]]
    except (ValueError, KeyError, IndexError):
        raise ValueError(
            f"completion_window {window!r} is not a number followed by s, m, h or d"
        ) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"completion_window {window!r} must be positive")
    if seconds > MAX_WINDOW_S:  # "1e15d": past any date a timestamp column or clock can hold
        raise ValueError(f"completion_window {window!r} is over the longest accepted, 3650d")
    return seconds


async def run_job(store: Store, provider: Provider, running: RunningJob) -> None:
    """Run (or resume) one job to a terminal state. Raises cancellation (the client is
    closing: the job stays active and resumes on the next ``async with``) and what the state
    directory raises while results are committed (a full disk: the job stays active too, with
    every committed result)."""
    job_id = running.job_id
    row = await to_thread.run_sync(store.job_row, job_id)
    remaining = float(row.expires_at or 0) - time.time()
    running.scope.deadline = anyio.current_time() + remaining
    with running.scope:
        if row.status == "validating" and not await validate_job(store, provider, job_id):
            return
        if row.status in ("validating", "in_progress"):
            if store.shared and store.owner is not None:
                await run_shared(store, provider, job_id, row, running, store.owner)
            else:
                await run_unfinished(store, provider, job_id, row, running)
    if running.lease_lost:
        raise LeaseLostError(job_id, store.owner or "this process")
    if store.shared and store.owner is not None:
        # a batch stopped here (cancelled, expired) ends once the processes helping with it
        # have stopped too: they see its status within a heartbeat and let their blocks go
        await _until_others_let_go(store, job_id, store.owner)
    row = await to_thread.run_sync(store.job_row, job_id)
    if running.cancel_requested or row.status == "cancelling":
        await finalize(store, job_id, "cancelled")
    elif running.scope.cancelled_caught and row.completed + row.failed < row.total:
        await finalize(store, job_id, "expired")
    else:  # every line has its result (also when the completion window closed after the last)
        await finalize(store, job_id, "completed")


async def validate_job(store: Store, provider: Provider, job_id: str) -> bool:
    """Validate a ``validating`` job's input file (and its model, with ``provider``); move it to
    ``in_progress`` (seeded from ``reuse_results_from``) or to ``failed`` with the errors.
    Returns whether it may run."""
    row = await to_thread.run_sync(store.job_row, job_id)
    path = store.file_path(row.input_file_id)
    await to_thread.run_sync(store.delete_results, job_id)  # a restarted validation starts clean

    def validate() -> Any:
        planner = JobLinePlanner(store, job_id, row.endpoint)
        report = None
        try:
            with path.open("rb") as f:
                report = validate_batch_file(f, endpoint=row.endpoint, on_request=planner)
        finally:
            planner.finish(keep=report is not None and report.ok)
        return report

    report = await to_thread.run_sync(validate)
    errors: list[BatchError] = list(report.errors)
    if report.ok:
        try:
            await provider.check_model(report.model)
        except ModelNotFoundError as exc:
            errors = [
                BatchError(
                    code=ErrorCode.model_not_found.value,
                    message=str(exc),
                    line=None,
                    param="body.model",
                )
            ]
    if errors:
        await to_thread.run_sync(store.delete_results, job_id)  # and the planned lines
        await to_thread.run_sync(
            lambda: store.update_job(
                job_id,
                where_status=("validating",),
                status="failed",
                failed_at=now(),
                errors=[e.model_dump(exclude_none=True) for e in errors],
            )
        )
        return False
    if row.seed_job_id:
        await to_thread.run_sync(store.copy_successes, row.seed_job_id, job_id)
    await to_thread.run_sync(
        lambda: store.update_job(
            job_id,
            where_status=("validating",),
            status="in_progress",
            in_progress_at=now(),
            total=report.total,
            model=report.model,
        )
    )
    return True


async def run_shared(
    store: Store, provider: Provider, job_id: str, row: Any, running: RunningJob, owner: str
) -> None:
    """:func:`run_unfinished` for the owner of a job in a database shared by processes that
    help run it (:func:`help_run`): the lines go a block lease at a time. While other
    processes hold blocks with unfinished lines, the owner waits (looking every
    :data:`SHARED_POLL_S`) until none holds one any more (they finished and let go, or went
    silent for the lease), then goes over the file again: done when a pass skips no block."""

    def claim(block: int) -> bool:
        return store.claim_block(job_id, block, owner, store.lease_s)

    def others_hold() -> bool:
        return store.others_hold_blocks(job_id, owner, store.lease_s)

    try:
        while True:
            if not await run_unfinished(store, provider, job_id, row, running, claim=claim):
                return
            while True:
                await anyio.sleep(SHARED_POLL_S)
                if not await to_thread.run_sync(others_hold):
                    break
    finally:
        with anyio.CancelScope(shield=True):
            await to_thread.run_sync(store.release_blocks, job_id, owner)


async def _until_others_let_go(store: Store, job_id: str, owner: str) -> None:
    """Wait until no other process holds a live block lease of the job (at most a lease: a
    silent holder's blocks are not live after that)."""
    with anyio.move_on_after(store.lease_s + SHARED_POLL_S):
        while True:
            if not await to_thread.run_sync(store.others_hold_blocks, job_id, owner, store.lease_s):
                return
            await anyio.sleep(SHARED_POLL_S / 4)


async def help_run(store: Store, provider: Provider, job_id: str, owner: str) -> bool:
    """Run the lines of another process's job whose blocks nobody holds, one pass over its
    file, under block leases for ``owner``; finishing the job stays its owner's. Whether it ran
    any line."""
    row = await to_thread.run_sync(store.job_row, job_id)
    claimed: list[int] = []

    def claim(block: int) -> bool:
        held = store.claim_block(job_id, block, owner, store.lease_s)
        if held:
            claimed.append(block)
        return held

    try:
        await run_unfinished(store, provider, job_id, row, None, claim=claim, helping=True)
    finally:
        with anyio.CancelScope(shield=True):
            await to_thread.run_sync(store.release_blocks, job_id, owner)
    return bool(claimed)


async def run_unfinished(
    store: Store,
    provider: Provider,
    job_id: str,
    row: Any,
    running: RunningJob | None = None,
    *,
    claim: Callable[[int], bool] | None = None,
    helping: bool = False,
) -> list[int]:
    """Run every request of the job (``row``: its jobs row) that has no result yet through
    ``provider.execute``, committing each result before its worker takes the next request
    (``running``: the job's record in this process, whose ``origin`` the first commit sets).
    With ``claim`` (blocking: take a block's lease), only the lines of the blocks it grants;
    returns the blocks with unfinished lines it did not grant. ``helping``: another process
    owns the job (merged lines left without an answer are the owner's to give)."""
    if not helping:
        await to_thread.run_sync(_answer_merged_lines, store, job_id)
    path = store.file_path(row.input_file_id)
    source = RequestSource(store, job_id, path, Endpoint(row.endpoint), claim)
    writer = GroupCommit(store, job_id, running)

    async def on_result(request: Request, result: Result) -> None:
        answered = row_for(job_id, request, result)
        rows = [answered]
        merged = source.merged.pop(request.index, [])
        for seq, custom_id in merged or ():
            rows.append(merged_row(job_id, answered, seq, custom_id))
        block = source.block_of.pop(request.index, None)
        await writer.put(rows, block)
        if merged is None:  # many: after its line's own row, a chunk per transaction
            await to_thread.run_sync(_answer_many_merged, store, job_id, answered, block)

    try:
        with batch_flow(job_id, row.metadata):  # a server's fair gate orders by it
            await run_requests(
                provider.execute,
                source,
                max_in_flight=provider.max_in_flight(),
                on_result=on_result,
            )
    finally:
        try:
            writer.flush()
        finally:
            source.close()
    return source.skipped


def _answer_many_merged(
    store: Store, job_id: str, answered: ResultRow, block: int | None = None
) -> None:
    """Give every line merged into ``answered``'s line its answer, :data:`_MERGED_CHUNK` rows
    per transaction (a row already there is left alone); ``block``: the block lease the line
    was sent under (each commit checks it)."""
    after = -1
    blocks = () if block is None else (block,)
    while lines := store.merged_lines(job_id, answered.seq, after, _MERGED_CHUNK):
        rows = [merged_row(job_id, answered, *line) for line in lines]
        store.commit_results(job_id, rows, blocks)
        after = lines[-1][0]


def _answer_merged_lines(store: Store, job_id: str) -> None:
    """Give merged lines still without a result the answer of the line they were merged into
    when that line has one already (results copied from an earlier batch that sent both, or a
    crash between a line's result and the rows of its many merged lines); a chunk of
    :data:`_MERGED_CHUNK` per transaction."""
    after = -1
    while lines := store.unanswered_merged(job_id, after, _MERGED_CHUNK):
        answered = store.result_rows(job_id, (same_as for _, _, same_as in lines))
        rows = [
            merged_row(job_id, answered[same_as], seq, custom_id)
            for seq, custom_id, same_as in lines
            if same_as in answered
        ]
        store.commit_results(job_id, rows)
        after = lines[-1][0]


async def finalize(store: Store, job_id: str, outcome: str) -> None:
    """Bring a job to ``outcome`` (completed, cancelled or expired): unfinished requests get
    ``batch_cancelled`` / ``batch_expired``, then the output and error files are written.
    Shielded: once started it finishes even if the client closes."""
    with anyio.CancelScope(shield=True):
        # results written to a database nobody else can see are not kept: say so (the caller
        # fails the batch with storage_error; this process can still read them)
        await to_thread.run_sync(store.check_in_place)
        if outcome == "completed":
            await to_thread.run_sync(
                lambda: store.update_job(
                    job_id, where_status=("in_progress",), status="finalizing", finalizing_at=now()
                )
            )
        else:
            await to_thread.run_sync(_fill_unfinished, store, job_id, outcome)
        try:
            output_id, error_id = await _write_files(store, job_id)
        except OutputWriteError as exc:
            error = BatchError(code=ErrorCode.output_write_failed.value, message=str(exc))
            await to_thread.run_sync(
                lambda: store.update_job(
                    job_id,
                    where_status=BatchStatus.ACTIVE,
                    status="failed",
                    failed_at=now(),
                    errors=[error.model_dump(exclude_none=True)],
                )
            )
            return
        stamp = {"completed": "completed_at", "cancelled": "cancelled_at", "expired": "expired_at"}
        ended: dict[str, Any] = {stamp[outcome]: now()}
        await to_thread.run_sync(
            lambda: store.update_job(
                job_id,
                where_status=BatchStatus.ACTIVE,
                status=outcome,
                output_file_id=output_id,
                error_file_id=error_id,
                **ended,
            )
        )


async def _write_files(store: Store, job_id: str) -> tuple[str | None, str | None]:
    """``write_job_files`` with :data:`WRITE_RETRY`; raises the last ``OutputWriteError``."""
    policy = WRITE_RETRY
    async for attempt in AsyncRetrying(
        stop=stop_after_attempt(policy.attempts),
        wait=wait_exponential(multiplier=policy.initial_s, max=policy.max_s),
        retry=retry_if_exception_type(OutputWriteError),
        reraise=True,
    ):
        with attempt:
            return await to_thread.run_sync(write_job_files, store, job_id)
    raise AssertionError("unreachable: tenacity either returns or reraises")


def _fill_unfinished(store: Store, job_id: str, outcome: str) -> None:
    """Record every unfinished request of a cancelled or expired job as failed with
    ``batch_cancelled`` / ``batch_expired`` (blocking; streams the input file)."""
    row = store.job_row(job_id)
    if row.total == 0 and row.status in ("validating", "cancelling") and not row.model:
        return  # cancelled before validation finished: no request lines known
    code = ErrorCode.batch_cancelled if outcome == "cancelled" else ErrorCode.batch_expired
    why = "cancelled" if outcome == "cancelled" else "past its completion window"
    message = f"the job was {why} before this request finished"
    with store.file_path(row.input_file_id).open("rb") as f:
        block: list[RequestLine] = []
        for line in iter_requests(f):
            block.append(line)
            if len(block) >= 1000:
                _fill_block(store, job_id, block, code, message)
                block = []
        if block:
            _fill_block(store, job_id, block, code, message)


def _fill_block(
    store: Store, job_id: str, block: list[RequestLine], code: ErrorCode, message: str
) -> None:
    done = store.finished_seqs(job_id, block[0].seq, block[-1].seq)
    rows = []
    for line in block:
        if line.seq in done:
            continue
        result = failed(code, message)
        row = ResultRow(
            seq=line.seq,
            custom_id=line.custom_id,
            ok=False,
            status_code=None,
            body=None,
            error=result.error,
        )
        rows.append(with_line(job_id, row))
    if rows:
        store.commit_results(job_id, rows)
