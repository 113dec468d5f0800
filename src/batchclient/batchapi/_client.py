"""``BatchAPIBatchInference``: the protocol over a remote OpenAI Batch API (OpenAI's discounted
batches, or another ``batchclient serve``). Guide: ``docs/batch-api.md``.

Every call and every job is a local job in the state directory that owns its remote batches
(:mod:`._runner`): ``batch_chat_completion`` writes its requests as batch JSONL into the state
directory, runs that file as a local job and reads the results back in input order. A call is
keyed by its content (the file's SHA-256, the remote URL, the endpoint and the window): the same
call made again after a crash re-attaches to the job it started instead of submitting again.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

import anyio
from anyio import to_thread

from .._core.client import BatchClient, eager
from .._core.provider import Provider
from .._core.request import Request, Result, item_error
from .._tools import ToolPlan, ToolRefusal, apply_to_body, mentions_tools, plan_tools
from ..errors import ConfigurationError, ErrorCode
from ..jobs import Batches, JobManager, JobRunner, ResultRow, Store, store_file
from ..types import Batch, BatchItemError, BatchProgress, BatchRequestCounts, ProgressCallback
from ._options import BatchAPIOptions
from ._parts import Limits, RemoteIds, batch_line
from ._provider import BatchAPIProvider
from ._runner import RemoteRunner, RunSettings

R = TypeVar("R")
CALL_MARK = "batchclient_call"
MAX_LINES = 50_000
MAX_BYTES = 200 * 1024 * 1024
"""OpenAI's limits for one batch input file: 50,000 requests, 200 MB (OpenAI Batch API guide).
Other flavours have their own (``FLAVORS``); ``max_lines`` / ``max_bytes`` default to them."""


class RemoteJobClient(BatchClient):
    """A client whose calls and jobs run as local jobs that own remote batches, run by
    ``runner`` (:class:`BatchAPIBatchInference`, and the provider batch clients built on a
    :class:`~batchclient.batchapi.RemoteBatchBackend`). A call is keyed by its content, the
    provider's ``identity()`` and ``completion_window``: made again after a crash, it
    re-attaches to the job it started. ``on_expired`` (a provider, or None) is started and
    stopped with the client."""

    def __init__(
        self,
        provider: Provider,
        runner: JobRunner,
        *,
        completion_window: str,
        poll_interval: float,
        on_expired: Provider | None = None,
        state_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(provider, state_dir=state_dir)
        self.completion_window = completion_window
        self.poll_interval = poll_interval
        self.on_expired = on_expired
        self._runner = runner
        self.batches = RemoteBatches(self._manager)
        """As every client's ``batches``; ``retrieve`` counts the lines remote batches have
        finished but not yet handed back."""

    def _job_runner(self) -> JobRunner | None:
        return self._runner

    async def __aenter__(self) -> Self:
        if self.on_expired is not None:
            await self.on_expired.start()
        try:
            return await super().__aenter__()  # resumes this state dir's unfinished jobs
        except BaseException:
            if self.on_expired is not None:
                await self.on_expired.stop()
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await super().__aexit__(exc_type, exc, tb)
        finally:
            if self.on_expired is not None:
                await self.on_expired.stop()

    # ------------------------------------------------------------------ one call = one job

    async def _run(
        self,
        requests: Iterable[Request],
        n: int,
        decode: Callable[[Request, Result], R],
        progress: ProgressCallback | None,
        on_item: Callable[[int, R], None] | None = None,
        cache: bool = False,
        *,
        build: Callable[[Any], R] | None = None,
    ) -> list[R]:
        """Write the call's requests as a batch file, run it as a local job on the remote API
        (or re-attach to the job an identical earlier call started), decode in input order
        (each item handed to ``on_item`` too, in input order, once the job has finished).

        Raises:
            ConfigurationError: ``cache=True``: the result cache is not available here (a
                repeated call re-attaches to its remote job instead, so it is not paid twice).
        """
        if build is not None:
            decode = eager(decode, build)
        if cache:
            raise ConfigurationError(
                f"the result cache is not available on {type(self).__name__}: a repeated call "
                "re-attaches to its remote batch instead (no second submission)"
            )
        manager = self._manager()
        store = await manager.store()
        started = time.perf_counter()
        calls = _CallRequests(requests, n)
        reader: Any = _Reader(calls.lines())  # a binary stream, as store_file reads one
        record = await to_thread.run_sync(
            store_file, store, reader, "batch", "batch_chat_completion.jsonl"
        )
        if calls.sent == 0:
            await to_thread.run_sync(store.delete_file, record.id)
            lost = item_error(ErrorCode.internal_error, "no result recorded")
            return _handed(self._decode(calls, iter(()), decode, n, lost), on_item)
        job_id, calls.key = await self._job_for(manager, store, record.id, calls.endpoint)
        await self._follow(job_id, n, calls.refused, started, progress)
        job = await manager.info(job_id)
        first = job.errors.data[0] if job.errors and job.errors.data else None
        lost = item_error(
            first.code if first else ErrorCode.internal_error,
            f"batch {job_id} {job.status}: {first.message}" if first else "no result recorded",
        )
        # decoded in a worker thread, streamed from SQLite: the rows are never all in memory
        results = await to_thread.run_sync(
            lambda: self._decode(calls, store.iter_results(job_id), decode, n, lost)
        )
        await to_thread.run_sync(
            lambda: RemoteIds(store).set_call(calls.key, job_id, delivered=True)
        )
        if progress is not None:
            bad = sum(getattr(r, "error", None) is not None for r in results)
            progress(
                BatchProgress(
                    total=n, completed=n - bad, failed=bad,
                    elapsed_s=time.perf_counter() - started,
                )
            )  # fmt: skip
        return _handed(results, on_item)

    async def _job_for(
        self, manager: JobManager, store: Store, file_id: str, endpoint: str
    ) -> tuple[str, str]:
        """The job for this call's file: the unfinished or undelivered job of an identical
        earlier call, or a new one. Returns (job id, call key)."""
        sha = await to_thread.run_sync(store.file_sha256, file_id)
        identity = json.dumps(self.provider.identity(), sort_keys=True)
        key = hashlib.sha256(
            f"{sha}\n{identity}\n{endpoint}\n{self.completion_window}".encode()
        ).hexdigest()[:40]
        previous = await to_thread.run_sync(lambda: RemoteIds(store).call(key))
        earlier: str | None = None
        if previous is None:  # died between creating its job and recording it: find the job
            jobs = await manager.list()
            earlier = next((j.id for j in jobs if (j.metadata or {}).get(CALL_MARK) == key), None)
        elif not previous.delivered:
            earlier = previous.job_id
        if earlier is not None:
            job = await manager.info(earlier)
            if job.status != "failed":  # re-attach: the file is already there
                await to_thread.run_sync(store.delete_file, file_id)
                await to_thread.run_sync(lambda: RemoteIds(store).set_call(key, job.id))
                return job.id, key
        batch = await manager.schedule(
            file_id,
            endpoint=endpoint,
            completion_window=self.completion_window,
            metadata={CALL_MARK: key},
        )
        await to_thread.run_sync(lambda: RemoteIds(store).set_call(key, batch.id))
        return batch.id, key

    async def _follow(
        self,
        job_id: str,
        n: int,
        refused: int,
        started: float,
        progress: ProgressCallback | None,
    ) -> None:
        async def report() -> None:
            assert progress is not None
            while True:
                counts = (await self.batches.retrieve(job_id)).request_counts
                progress(
                    BatchProgress(
                        total=n, completed=counts.completed, failed=counts.failed + refused,
                        in_flight=max(0, counts.total - counts.completed - counts.failed),
                        elapsed_s=time.perf_counter() - started,
                    )
                )  # fmt: skip
                await anyio.sleep(min(self.poll_interval, 1.0))

        async with anyio.create_task_group() as tg:
            if progress is not None:
                tg.start_soon(report)
            await self._manager().wait(job_id)
            tg.cancel_scope.cancel()

    def _decode(
        self,
        calls: _CallRequests,
        rows: Iterator[ResultRow],
        decode: Callable[[Request, Result], R],
        n: int,
        lost: BatchItemError,
    ) -> list[R]:
        out: list[R | None] = [None] * n
        for request in calls.refused_requests:
            out[request.index] = decode(request, Result(None, None, error=request.error))
        for row in rows:
            index = int(row.custom_id)
            known = calls.by_index[index]
            assert known is not None
            out[index] = decode(known, _result_of(row, calls.plans.get(index)))
        missing = [i for i, r in enumerate(out) if r is None]
        for i in missing:  # a job that failed as a whole has no rows: never lose an item
            request = calls.by_index[i] or Request(index=i, body={})
            out[i] = decode(request, Result(None, None, error=lost))
        return out  # type: ignore[return-value]


class BatchAPIBatchInference(RemoteJobClient):
    """Batch inference through a remote OpenAI Batch API. Use as ``async with``.

    Args (every one after ``api_key`` keyword-only; ``poll_interval``, ``completion_window``,
    ``max_retries``, ``timeout``, ``retry``, ``headers``, ``check_model`` and ``flavor`` are
    :class:`BatchAPIOptions`, the provider's):
        base_url: the API root ending in ``/v1``: ``https://api.openai.com/v1``, a
            ``batchclient serve`` (``http://host:port/v1``), ``https://api.together.xyz/v1``,
            ``https://api.groq.com/openai/v1`` or ``https://api.mistral.ai/v1``.
        flavor: the provider's variant of the OpenAI Batch API: ``"openai"``,
            ``"together"``, ``"groq"`` or ``"mistral"`` (statuses, timestamps, file purpose,
            paths and paging are translated; ``docs/batch-api.md``). None (default): named by
            the base URL's host, else ``"openai"``.
        api_key: sent as ``Authorization: Bearer <api_key>``; None sends no header.
        poll_interval: seconds between two polls of a remote batch (default 10).
        max_lines: the most requests in one remote batch (default: the flavour's limit, 50,000
            for all four); larger inputs are split into several remote batches that run at once.
        max_bytes: the largest remote input file in bytes (default: the flavour's limit, 200 MiB
            for OpenAI, 100 MiB for the others); a single request line above it is an
            ``invalid_request`` item.
        completion_window: the remote batches' window (OpenAI and Together accept only
            ``"24h"``, Groq ``"24h"`` to ``"7d"``, Mistral whole hours up to ``"7d"``; other
            servers their own); the local job expires this long (plus ``expiry_grace_s``) after
            it was created.
        on_expired: a provider (or a client: its provider) that re-runs, live, the requests an
            expired remote batch did not run; None (default): they are ``batch_expired`` items.
            This client starts and stops it.
        max_retries: retries of a transient failure (connection error, timeout, 408/409/429/5xx)
            of an upload, create, cancel or download (default 8). Polls retry without limit.
        timeout: seconds without progress on one HTTP call (default 600).
        retry: backoff between retries and the longest ``Retry-After`` honoured
            (:class:`~batchclient.RetryPolicy`).
        headers: extra HTTP headers for every call.
        check_model: ask ``GET /models`` once per model and raise ``ModelNotFoundError`` for a
            model the server does not list (skipped when it cannot list models).
        expiry_grace_s: how long past the local job's window its remote batches are still
            waited for before they are cancelled (default 600 s).
        state_dir: where files, jobs, remote batch ids and results are kept (default
            ``$BATCHCLIENT_STATE_DIR`` or the user data directory).

    Raises:
        ConfigurationError: a bad argument (an unknown flavour, a window it refuses).
    """

    provider: BatchAPIProvider

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        max_lines: int | None = None,
        max_bytes: int | None = None,
        on_expired: Provider | BatchClient | None = None,
        expiry_grace_s: float = 600.0,
        state_dir: str | os.PathLike[str] | None = None,
        **options: Unpack[BatchAPIOptions],
    ) -> None:
        if max_lines is not None and max_lines < 1:
            raise ConfigurationError("max_lines must be >= 1")
        if max_bytes is not None and max_bytes < 1024:
            raise ConfigurationError("max_bytes must be >= 1024")
        if expiry_grace_s < 0:
            raise ConfigurationError("expiry_grace_s must be >= 0 seconds")
        provider = BatchAPIProvider(base_url, api_key, **options)
        spec = provider.api.flavor
        max_lines = spec.max_lines if max_lines is None else max_lines
        max_bytes = spec.max_bytes if max_bytes is None else max_bytes
        live = on_expired.provider if isinstance(on_expired, BatchClient) else on_expired
        settings = RunSettings(Limits(max_lines, max_bytes), provider.poll_interval, expiry_grace_s)
        super().__init__(
            provider,
            RemoteRunner(provider.api, provider, settings, live),
            completion_window=provider.completion_window,
            poll_interval=provider.poll_interval,
            on_expired=live,
            state_dir=state_dir,
        )

    @property
    def base_url(self) -> str:
        return self.provider.base_url


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
        self.refused_requests: list[Request] = []
        self.plans: dict[int, ToolPlan] = {}
        self.endpoint = ""
        self.sent = 0
        self.key = ""

    @property
    def refused(self) -> int:
        return len(self.refused_requests)

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
                self.refused_requests.append(request)
                continue
            endpoint = request.endpoint.value
            if self.endpoint and endpoint != self.endpoint:
                raise ConfigurationError("one call's requests must share one endpoint")
            self.endpoint = endpoint
            self.sent += 1
            yield batch_line(str(request.index), endpoint, body)
            request.body = {}  # decoding needs the checks, not the body: memory stays flat


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
    """``client.batches`` of a ``BatchAPIBatchInference``: ``retrieve`` adds to the local
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
