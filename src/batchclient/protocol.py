"""``BatchInference``: the one protocol eval code talks to.

The five calls of the original "Batch Inference Support" request (Llama Stack; see
``docs/design.md``). Every provider (``RemoteBatchInference``, ``VLLMBatchInference``) implements
it, so eval code swaps providers by changing one constructor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ._scheduler import ProgressCallback
from .jobs._files import Files
from .types import (
    BatchChatCompletionResponse,
    BatchJob,
    Job,
    JobStatus,
    LogProbConfig,
    MessageLike,
    ResponseFormat,
    SamplingParams,
    ToolChoice,
    ToolDefinition,
    ToolPromptFormat,
)

__all__ = ["BatchInference"]


@runtime_checkable
class BatchInference(Protocol):
    """Batch chat completion now, or as a durable job over an OpenAI batch JSONL file."""

    async def batch_chat_completion(
        self,
        model: str,
        messages_batch: Sequence[Sequence[MessageLike]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: Sequence[ToolDefinition | dict[str, Any]] | None = None,
        tool_choice: ToolChoice | str = ToolChoice.auto,
        tool_prompt_format: ToolPromptFormat | None = None,
        response_format: ResponseFormat | dict[str, Any] | None = None,
        logprobs: LogProbConfig | None = None,
        *,
        custom_ids: Sequence[str] | None = None,
        progress: ProgressCallback | None = None,
        raise_on_error: bool = False,
    ) -> BatchChatCompletionResponse:
        """One answer per conversation, in input order; failures are per-item ``error``s."""
        ...

    @property
    def files(self) -> Files:
        """Upload, list, read and delete files in the client's state directory."""
        ...

    async def schedule_batch(
        self,
        file_id: str,
        *,
        completion_window: str = "24h",
        metadata: dict[str, str] | None = None,
        reuse_results_from: str | None = None,
    ) -> Job:
        """Validate an uploaded OpenAI batch JSONL file and run it in the background."""
        ...

    async def job_info(self, job_id: str) -> BatchJob:
        """The OpenAI-shaped batch record (status, timestamps, request counts, files, usage)."""
        ...

    async def job_wait(self, job_id: str) -> BatchJob:
        """Wait until the job is finished (completed, failed, cancelled or expired)."""
        ...

    async def list_jobs(self, limit: int | None = None) -> list[BatchJob]:
        """The jobs of the client's state directory, newest first."""
        ...

    async def job_status(self, job_id: str) -> JobStatus | None:
        """The job's state, or None for an unknown job."""
        ...

    async def job_cancel(self, job_id: str) -> None:
        """Stop the job, keeping every finished result."""
        ...

    async def job_result(self, job_id: str) -> BatchChatCompletionResponse:
        """One item per input line, in input order, each with its ``custom_id``."""
        ...
