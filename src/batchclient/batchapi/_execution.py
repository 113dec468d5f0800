"""``RemoteBatchExecution``: a client's calls and batches run as remote batches of a provider's
batch API (``BatchClient(provider, execution=RemoteBatchExecution(provider))``; the batch
clients are that). Guide: ``docs/batch-api.md``."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import anyio
from anyio import to_thread

from .._core.client import eager
from .._core.execution import Call, Execution, LiveRun
from .._core.request import Request, Result, item_error
from .._tools import ToolPlan, ToolRefusal, apply_to_body, mentions_tools, plan_tools
from ..errors import ConfigurationError, ErrorCode
from ..jobs import Batches, JobManager
from ..jobs._files import store_file
from ..jobs._runner import JobRunner
from ..jobs._store import ResultRow, Store
from ..types import Batch, BatchItemError, BatchProgress, BatchRequestCounts, ProgressCallback
from ._parts import RemoteIds, batch_line
from ._provider import RemoteBatchProvider
from ._runner import RemoteRunner

R = TypeVar("R")
CALL_MARK = "batchclient_call"


class RemoteBatchExecution(Execution):
    """Calls and batches of a client over ``provider`` run as remote batches: each a durable
    local job in the state directory that owns them (:class:`~._runner.RemoteRunner`). A call
    writes its requests as a batch file, runs it as a local job and reads the results back in
    input order; it is keyed by its content (the file's SHA-256), the provider's
    ``identity()``, the endpoint and the ``completion_window``, so made again after a crash it
    re-attaches to the job it started instead of submitting again. ``client.batches.retrieve``
    counts what the remote batches finished but did not hand back yet."""

    def __init__(self, provider: RemoteBatchProvider) -> None:
        self.provider = provider

    def job_runner(self) -> JobRunner:
        return RemoteRunner(self.provider)

    def batches(self, jobs: Callable[[], JobManager]) -> Batches:
        return RemoteBatches(jobs)

    # ------------------------------------------------------------------ one call = one job

    async def run(self, call: Call[R], jobs: Callable[[], JobManager], live: LiveRun) -> list[R]:
        """The call's items in input order (each handed to ``on_item`` too, once the job has
        finished).

        Raises:
            ConfigurationError: ``cache=True``: the result cache is not available here (a
                repeated call re-attaches to its remote job instead, so it is not paid twice).
        """
        if call.cache:
            raise ConfigurationError(
                f"the result cache is not available with {self.provider.backend.name}: a "
                "repeated call re-attaches to its remote batch instead (no second submission)"
            )
        decode = call.decode if call.build is None else eager(call.decode, call.build)
        manager = jobs()
        store = await manager.store()
        started = time.perf_counter()
        calls = _CallRequests(call.requests, call.n)
        reader: Any = _Reader(calls.lines())  # a binary stream, as store_file reads one
        record = await to_thread.run_sync(
            store_file, store, reader, "batch", "batch_chat_completion.jsonl"
        )
        if calls.sent == 0:  # every request was refused before it was sent
            await to_thread.run_sync(store.delete_file, record.id)
            lost = item_error(ErrorCode.internal_error, "no result recorded")
            return _handed(calls.decoded(iter(()), decode, lost), call.on_item)
        job_id, key = await self._job_for(manager, store, record.id, calls.endpoint)
        async with anyio.create_task_group() as tg:
            if call.progress is not None:
                tg.start_soon(self._report, manager, job_id, calls, started, call.progress)
            await manager.wait(job_id)
            tg.cancel_scope.cancel()
        job = await manager.info(job_id)
        first = job.errors.data[0] if job.errors and job.errors.data else None
        lost = item_error(
            first.code if first else ErrorCode.internal_error,
            f"batch {job_id} {job.status}: {first.message}" if first else "no result recorded",
        )
        # decoded in a worker thread, streamed from SQLite: the rows are never all in memory
        results = await to_thread.run_sync(
            lambda: calls.decoded(store.iter_results(job_id), decode, lost)
        )
        await to_thread.run_sync(lambda: RemoteIds(store).set_call(key, job_id, delivered=True))
        if call.progress is not None:
            bad = sum(getattr(r, "error", None) is not None for r in results)
            elapsed = time.perf_counter() - started
            call.progress(
                BatchProgress(total=call.n, completed=call.n - bad, failed=bad, elapsed_s=elapsed)
            )
        return _handed(results, call.on_item)

    async def _job_for(
        self, manager: JobManager, store: Store, file_id: str, endpoint: str
    ) -> tuple[str, str]:
        """The job for this call's file: the unfinished or undelivered job of an identical
        earlier call, or a new one. Returns (job id, call key)."""
        sha = await to_thread.run_sync(store.file_sha256, file_id)
        identity = json.dumps(self.provider.identity(), sort_keys=True)
        window = self.provider.completion_window
        key = hashlib.sha256(f"{sha}\n{identity}\n{endpoint}\n{window}".encode()).hexdigest()[:40]
        previous = await to_thread.run_sync(lambda: RemoteIds(store).call(key))
        earlier: str | None = None
        if previous is None:  # died between creating its job and recording it: find the job
            jobs = await manager.list()
            earlier = next((j.id for j in jobs if (j.metadata or {}).get(CALL_MARK) == key), None)
        elif not previous.delivered:
            earlier = previous.job_id
        if earlier is not None and (await manager.info(earlier)).status != "failed":
            job_id = earlier  # re-attach: the file is already there
            await to_thread.run_sync(store.delete_file, file_id)
        else:
            metadata = {CALL_MARK: key}
            batch = await manager.schedule(
                file_id, endpoint=endpoint, completion_window=window, metadata=metadata
            )
            job_id = batch.id
        await to_thread.run_sync(lambda: RemoteIds(store).set_call(key, job_id))
        return job_id, key

    async def _report(
        self, manager: JobManager, job_id: str, calls: _CallRequests, started: float,
        progress: ProgressCallback,
    ) -> None:  # fmt: skip
        """Report the job's progress until cancelled, with what its remote batches finished."""
        batches = RemoteBatches(lambda: manager)
        n, refused = len(calls.by_index), len(calls.refused)
        while True:
            counts = (await batches.retrieve(job_id)).request_counts
            progress(
                BatchProgress(
                    total=n, completed=counts.completed, failed=counts.failed + refused,
                    in_flight=max(0, counts.total - counts.completed - counts.failed),
                    elapsed_s=time.perf_counter() - started,
                )
            )  # fmt: skip
            await anyio.sleep(min(self.provider.options["poll_interval_s"], 1.0))


def _handed(results: list[R], on_item: Callable[[int, R], None] | None) -> list[R]:
    if on_item is not None:
        for index, item in enumerate(results):
            on_item(index, item)
    return results


class _CallRequests:
    """The requests of one call as batch lines (``custom_id`` = the item's index), keeping
    what decoding needs without the bodies: each request with its body dropped, and the tool
    plans of requests whose tools are written into the prompt."""

    def __init__(self, requests: Iterable[Request], n: int) -> None:
        self._requests = requests
        self.by_index: list[Request | None] = [None] * n
        self.refused: list[Request] = []
        self.plans: dict[int, ToolPlan] = {}
        self.endpoint = ""
        self.sent = 0

    def lines(self) -> Iterator[bytes]:
        for request in self._requests:
            self.by_index[request.index] = request
            body = request.body
            if (
                request.error is None
                and request.tool_prompt_format is not None
                and mentions_tools(body)
            ):
                try:
                    body, plan = plan_tools(body, request.tool_prompt_format)
                except ToolRefusal as refusal:
                    request.error = item_error(
                        refusal.code, refusal.message, status_code=400, param=refusal.param
                    )
                else:
                    if plan is not None:
                        self.plans[request.index] = plan
            if request.error is not None:
                self.refused.append(request)
                continue
            endpoint = request.endpoint.value
            if self.endpoint and endpoint != self.endpoint:
                raise ConfigurationError("one call's requests must share one endpoint")
            self.endpoint = endpoint
            self.sent += 1
            yield batch_line(str(request.index), endpoint, body)
            request.body = {}  # decoding needs the checks, not the body: memory stays flat

    def decoded(
        self,
        rows: Iterator[ResultRow],
        decode: Callable[[Request, Result], R],
        lost: BatchItemError,
    ) -> list[R]:
        """Every request's item: the refused ones', those of the job's ``rows``, and ``lost``
        for any request without a row."""
        out: list[R | None] = [None] * len(self.by_index)
        for request in self.refused:
            out[request.index] = decode(request, Result(None, None, error=request.error))
        for row in rows:
            index = int(row.custom_id)
            known = self.by_index[index]
            assert known is not None
            out[index] = decode(known, _result_of(row, self.plans.get(index)))
        missing = [i for i, r in enumerate(out) if r is None]
        for i in missing:  # a job that failed as a whole has no rows: never lose an item
            request = self.by_index[i] or Request(index=i, body={})
            out[i] = decode(request, Result(None, None, error=lost))
        return out  # type: ignore[return-value]


class _Reader:
    """A binary stream over an iterator of lines (what ``store_file`` copies from)."""

    def __init__(self, lines: Iterator[bytes]) -> None:
        self._lines = lines

    def read(self, size: int = -1) -> bytes:
        chunk: list[bytes] = []
        got = 0
        for line in self._lines:
            chunk.append(line)
            got += len(line)
            if size >= 0 and got >= size:
                break
        return b"".join(chunk)


def _result_of(row: ResultRow, plan: ToolPlan | None) -> Result:
    """A stored row as a result to decode again with the original request (so its checks run
    with the request's own schemas and tool plan)."""
    status = row.status_code
    if status is not None and 200 <= status < 300 and isinstance(row.body, dict):
        body = row.body
        if plan is not None:
            apply_to_body(plan, body)
        return Result(status_code=status, body=body, request_id=row.request_id)
    return Result(status_code=status, body=row.body, error=row.error, request_id=row.request_id)


class RemoteBatches(Batches):
    """``client.batches`` of a client over a remote batch API: ``retrieve`` adds to the local
    request counts what the job's remote batches report finished but not yet handed back."""

    async def retrieve(self, batch_id: str) -> Batch:
        manager = self._manager()
        batch = await manager.info(batch_id)
        if batch.status not in ("in_progress", "cancelling", "finalizing"):
            return batch
        store = await manager.store()
        parts = await to_thread.run_sync(lambda: RemoteIds(store).parts(batch_id))
        live = [p for p in parts if p.state != "collected"]
        counts = batch.request_counts
        total = counts.total
        completed = min(total, counts.completed + sum(p.completed for p in live))
        failed = min(total - completed, counts.failed + sum(p.failed for p in live))
        batch.request_counts = BatchRequestCounts(total=total, completed=completed, failed=failed)
        return batch
