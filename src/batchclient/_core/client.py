"""``BatchClient``: the ``BatchInference`` protocol over any :class:`Provider`.

The client owns the ``async with`` lifecycle (the provider's start and stop, the job manager of
its state directory), builds the requests of a call (:mod:`.encode`), runs them through the one
primitive (:func:`.scheduler.run_requests`) and decodes each result at its input position
(:mod:`.decode`). Files and batches are ``client.files`` and ``client.batches``; the original
protocol's job calls delegate to them. Guide: ``docs/design.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

from ..errors import BatchFailedError, ClientClosedError
from ..jobs import Batches, Files, JobManager, JobRunner, default_state_dir
from ..types import (
    BatchChatCompletionResponse,
    BatchOptions,
    Job,
    JobStatus,
    LogProbConfig,
    MessageLike,
    ProgressCallback,
    ResponseFormatArg,
    SamplingParams,
    ToolChoice,
    ToolDefinition,
    ToolPromptFormat,
)
from .decode import to_response
from .encode import chat_requests
from .provider import Provider
from .request import Request, Result
from .scheduler import ProgressTracker, run_requests

__all__ = ["BatchClient"]

R = TypeVar("R")


class BatchClient:
    """Batch inference and durable jobs over ``provider``. Use as ``async with``.

    ``RemoteBatchInference`` and ``VLLMBatchInference`` are this client over their providers;
    ``BatchClient(MyProvider())`` gives a provider of your own the whole protocol.

    Args:
        provider: what runs the requests.
        state_dir: where files, batches and their results are kept (default
            ``$BATCHCLIENT_STATE_DIR`` or the user data directory). Batches left unfinished
            there resume on entering a client whose provider has the same identity.
    """

    def __init__(
        self, provider: Provider, *, state_dir: str | os.PathLike[str] | None = None
    ) -> None:
        self.provider = provider
        self._state_dir = (
            Path(state_dir).expanduser() if state_dir is not None else default_state_dir()
        )
        self._jobs: JobManager | None = None
        self.files = Files(lambda: self._manager().store())
        """Upload, list, read and delete files (``create``, ``retrieve``, ``content``, ``path``,
        ``list``, ``delete``)."""
        self.batches = Batches(self._manager)
        """OpenAI-style batches over uploaded files (``create``, ``retrieve``, ``list``,
        ``cancel``, ``wait``, ``export``)."""

    @property
    def state_dir(self) -> Path:
        """Where files, batches and results are kept (a SQLite database and ``files/``)."""
        return self._state_dir

    @property
    def is_open(self) -> bool:
        """Whether the client is inside its ``async with`` block (provider started, batches
        running)."""
        return self._jobs is not None

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        await self.provider.start()
        try:
            manager = JobManager(self._state_dir, provider=self.provider, runner=self._job_runner())
            await manager.__aenter__()  # resumes batches left unfinished in the state directory
        except BaseException:
            await self.provider.stop()
            raise
        self._jobs = manager
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        manager, self._jobs = self._jobs, None
        try:
            if manager is not None:
                await manager.__aexit__(None, None, None)  # pauses running batches
        finally:
            await self.provider.stop()

    def _job_runner(self) -> JobRunner | None:
        """How this client's jobs run; None: through ``provider.execute`` (a client whose
        requests go elsewhere, such as a remote Batch API, returns its own)."""
        return None

    def _manager(self) -> JobManager:
        if self._jobs is None:
            raise ClientClosedError(
                f"{type(self).__name__} is not open: use it inside `async with`"
            )
        return self._jobs

    # ------------------------------------------------------------------ the synchronous calls

    async def batch_chat_completion(
        self,
        model: str,
        messages_batch: Sequence[Sequence[MessageLike]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: Sequence[ToolDefinition | dict[str, Any]] | None = None,
        tool_choice: ToolChoice | str = ToolChoice.auto,
        tool_prompt_format: ToolPromptFormat | None = None,
        response_format: ResponseFormatArg | Sequence[ResponseFormatArg] = None,
        logprobs: LogProbConfig | Sequence[LogProbConfig | None] | None = None,
        *,
        custom_ids: Sequence[str] | None = None,
        progress: ProgressCallback | None = None,
        raise_on_error: bool = False,
    ) -> BatchChatCompletionResponse:
        """Run one chat completion per conversation; return the answers in input order.

        See :meth:`batchclient.BatchInference.batch_chat_completion` for the arguments, the
        result and the errors raised.
        """
        self._manager()
        requests = chat_requests(
            model,
            messages_batch,
            sampling_params,
            tools,
            tool_choice,
            tool_prompt_format,
            response_format,
            logprobs,
            custom_ids,
        )
        await self.provider.check_model(model)
        batch = await self._run(requests, len(messages_batch), to_response, progress)
        response = BatchChatCompletionResponse(batch=batch)
        if raise_on_error and response.errors:
            raise BatchFailedError(response, response.errors)
        return response

    async def _run(
        self,
        requests: Iterable[Request],
        n: int,
        decode: Callable[[Request, Result], R],
        progress: ProgressCallback | None,
    ) -> list[R]:
        """Run ``n`` requests (indexes ``0..n-1``) through the provider; ``decode`` each result
        into its slot. Every slot is filled: the primitive reports every request once."""
        provider = self.provider
        results: list[R | None] = [None] * n
        tracker = ProgressTracker(
            total=n, callback=progress, concurrency_limit=provider.concurrency_limit
        )

        async def execute(request: Request) -> Result:
            tracker.in_flight += 1
            try:
                return await provider.execute(request)
            finally:
                tracker.in_flight -= 1

        def on_result(request: Request, result: Result) -> None:
            item = decode(request, result)
            results[request.index] = item
            tracker.record(result, getattr(item, "error", None) is None)

        await run_requests(execute, requests, window=provider.window(), on_result=on_result)
        tracker.finish()
        missing = [i for i, r in enumerate(results) if r is None]
        assert not missing, f"items without a result: {missing[:10]}"  # the primitive's contract
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------ the original job calls

    async def schedule_batch(self, file_id: str, **options: Unpack[BatchOptions]) -> Job:
        """Validate an uploaded OpenAI batch JSONL file and run it in the background; see
        :meth:`batchclient.BatchInference.schedule_batch`."""
        batch = await self.batches.create(file_id, **options)
        return Job(job_id=batch.id)

    async def job_status(self, job_id: str) -> JobStatus | None:
        """The job's state in the original protocol's terms, or None for an unknown job."""
        return await self._manager().status(job_id)

    async def job_cancel(self, job_id: str) -> None:
        """Stop the job, keeping every finished result; see ``batches.cancel``."""
        await self.batches.cancel(job_id)

    async def job_result(self, job_id: str) -> BatchChatCompletionResponse:
        """One item per input line, in input order, each with its ``custom_id``."""
        return await self._manager().result(job_id)
