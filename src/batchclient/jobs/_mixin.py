"""The job calls every provider client has (mixed into ``BaseBatchClient``): ``files``,
``schedule_batch``, ``job_status``, ``job_info``, ``job_cancel``, ``job_result``, ``job_wait``,
``list_jobs``. They delegate to a :class:`JobManager` created when the client is entered."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

from ..errors import ClientClosedError
from ..types import BatchChatCompletionResponse, BatchJob, Job, JobStatus
from ._files import Files
from ._manager import JobManager
from ._runner import JobProvider
from ._store import default_state_dir


class JobsMixin:
    """Files and durable jobs over OpenAI batch JSONL, shared by every provider. Guide:
    ``docs/jobs.md``."""

    _jobs_state_dir: Path
    _jobs: JobManager | None
    _files: Files

    def _init_jobs(self, state_dir: str | os.PathLike[str] | None) -> None:
        self._jobs_state_dir = (
            Path(state_dir).expanduser() if state_dir is not None else default_state_dir()
        )
        self._jobs = None
        self._files = Files(self._manager)

    def _job_identity(self) -> dict[str, Any]:
        """What a job must run on to be resumed by this client: providers add what changes the
        answers (remote: the base URL; inline: the model). Never secrets."""
        return {"provider": type(self).__name__}

    async def _open_jobs(self) -> None:
        manager = JobManager(
            self._jobs_state_dir,
            provider=cast(JobProvider, self),
            identity=self._job_identity(),
        )
        await manager.__aenter__()  # resumes orphaned jobs of this state directory
        self._jobs = manager

    async def _close_jobs(self) -> None:
        manager, self._jobs = self._jobs, None
        if manager is not None:
            await manager.__aexit__(None, None, None)  # pauses running jobs

    def _manager(self) -> JobManager:
        if self._jobs is None:
            raise ClientClosedError(
                f"{type(self).__name__} is not open: use it inside `async with`"
            )
        return self._jobs

    @property
    def state_dir(self) -> Path:
        """Where files, jobs and results are kept (SQLite database + ``files/``)."""
        return self._jobs_state_dir

    @property
    def files(self) -> Files:
        """Upload, list, read and delete files (``create``, ``retrieve``, ``content``, ``path``,
        ``list``, ``delete``)."""
        return self._files

    async def schedule_batch(
        self,
        file_id: str,
        *,
        completion_window: str = "24h",
        metadata: dict[str, str] | None = None,
        reuse_results_from: str | None = None,
    ) -> Job:
        """Validate an uploaded OpenAI batch JSONL file and run it in the background.

        Returns at once with the job (status ``validating``); the job runs inside this
        client's ``async with`` block (leaving the block pauses it; the next client on the same
        state directory and provider resumes it). Validation is all-or-nothing: a bad file gives
        a ``failed`` job whose ``job_info(...).errors`` lists each bad line (OpenAI codes,
        1-based physical line, ``param``).

        Args:
            file_id: a file uploaded with ``files.create`` (purpose ``batch``).
            completion_window: how long the job may run, counted from its creation: a number
                and a unit, ``"24h"``, ``"30m"``, ``"5s"``, ``"2d"``. After it the job is
                ``expired``: finished results are kept, the rest fail with ``batch_expired``.
            metadata: up to 16 string pairs (keys <= 64, values <= 512 characters).
            reuse_results_from: the id of an earlier job over the same file content whose
                successful results are copied instead of being sent again.

        Raises:
            FileNotFoundInStoreError: unknown ``file_id``.
            JobNotFoundError: unknown ``reuse_results_from``.
            ConfigurationError: bad window or metadata, a file that is not ``batch``, or a
                ``reuse_results_from`` job over other content.
        """
        return await self._manager().schedule(
            file_id,
            completion_window=completion_window,
            metadata=metadata,
            reuse_results_from=reuse_results_from,
        )

    async def job_status(self, job_id: str) -> JobStatus | None:
        """The job's state in the original protocol's terms (``scheduled``, ``in_progress``,
        ``completed``, ``failed``, ``cancelled``; ``expired`` maps to ``failed``), or None for
        an unknown job. ``job_info`` has the finer OpenAI status."""
        return await self._manager().status(job_id)

    async def job_info(self, job_id: str) -> BatchJob:
        """The OpenAI-shaped batch record: status, timestamps (unix seconds), request counts
        (total / completed / failed; they only grow), validation errors, output and error file
        ids, token usage. Raises ``JobNotFoundError``."""
        return await self._manager().info(job_id)

    async def list_jobs(self, limit: int | None = None) -> list[BatchJob]:
        """Every job of the state directory, newest first (at most ``limit``)."""
        return await self._manager().list(limit)

    async def job_wait(self, job_id: str) -> BatchJob:
        """Wait until the job is ``completed``, ``failed``, ``cancelled`` or ``expired``
        and return its record (bound the wait with ``anyio.fail_after``)."""
        return await self._manager().wait(job_id)

    async def job_cancel(self, job_id: str) -> None:
        """Cancel a job: in-flight requests are aborted (HTTP requests closed, engine
        requests aborted), every finished result is kept, the rest fail with
        ``batch_cancelled``. Returns once the job is ``cancelled`` (status ``cancelling`` in
        between). A job running in another process is stopped by that process within about a
        second. Cancelling a cancelled job does nothing.

        Raises:
            JobNotFoundError: unknown job.
            JobStateError: the job is ``completed``, ``failed``, ``expired`` or ``finalizing``
                (OpenAI answers 409).
        """
        await self._manager().cancel(job_id)

    async def job_result(self, job_id: str) -> BatchChatCompletionResponse:
        """One ``ChatCompletionResponse`` per input line, in input order, each with its
        ``custom_id``; failed lines (API refusals, ``batch_cancelled``, ...) carry ``error``.

        Raises:
            JobNotFoundError: unknown job.
            JobStateError: the job failed validation (see ``job_info(...).errors``) or is not
                finished yet (``job_wait`` first).
        """
        return await self._manager().result(job_id)
