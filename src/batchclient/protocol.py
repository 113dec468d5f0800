"""``BatchInference``: the one protocol eval code talks to.

The five calls of the original "Batch Inference Support" request to Llama Stack
(``batch_chat_completion``, ``schedule_batch``, ``job_status``, ``job_cancel``, ``job_result``),
plus ``files`` and ``batches`` (OpenAI's Files and Batches APIs in spirit). Every client
(``BatchClient`` over any provider, ``RemoteBatchInference``, ``VLLMBatchInference``)
implements it, so eval code swaps providers by changing one constructor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, Unpack, runtime_checkable

from .types import (
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

if TYPE_CHECKING:
    from .jobs import Batches, Files

__all__ = ["BatchInference"]


@runtime_checkable
class BatchInference(Protocol):
    """Batch chat completion now, or as a durable job over an OpenAI batch JSONL file."""

    @property
    def files(self) -> Files:
        """Upload, list, read and delete files in the client's state directory."""
        ...

    @property
    def batches(self) -> Batches:
        """Create, retrieve, list, wait for, cancel and export batches (jobs)."""
        ...

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
        cache: bool | None = None,
    ) -> BatchChatCompletionResponse:
        """Run one chat completion per conversation; return the answers in input order.

        Args:
            model: the model to use (remote: the served model name; inline: ``smollm2`` for the
                bundled model, or the loaded model's path or served name).
            messages_batch: one list of messages per conversation; typed messages or OpenAI-style
                dicts (``{"role": "user", "content": "..."}``).
            sampling_params: one ``SamplingParams`` for all items, or a list aligned with
                ``messages_batch`` (one per item). Default: greedy, the provider's max length.
            tools: tool definitions (``ToolDefinition`` or OpenAI ``tools[]`` dicts), offered
                to every item. Calls come back as ``completion_message.tool_calls`` (arguments
                as a dict, checked against the tool's parameter schema: ``invalid_tool_call``
                otherwise). ``docs/structured.md`` explains how each provider carries them.
            tool_choice: ``auto`` (the model decides), ``required`` (at least one call),
                ``none`` (no tools offered), or a tool's name (exactly that tool).
            tool_prompt_format: ``json``, ``function_tag`` or ``python_list``: write the tools
                into the system prompt in that format and read calls back from the answer's
                text (Llama Stack's formats). None: the model's own tool calling (remote: the
                server's; inline: the chat template when it renders tools and a
                ``tool_call_parser`` is set, else ``json``).
            response_format: a JSON schema or grammar the answers must follow; one for all
                items, or a list aligned with ``messages_batch`` (None = unconstrained item).
                A JSON answer that does not match its schema is ``invalid_structured_output``.
            logprobs: per-token log-probabilities with ``top_k`` alternatives; one config for
                all items, or a list aligned with ``messages_batch`` (None = no logprobs).
            custom_ids: the caller's id per item, echoed as ``ChatCompletionResponse.custom_id``.
            progress: called with a ``BatchProgress`` (at most every 0.2 s, and at the end).
            raise_on_error: raise ``BatchFailedError`` (holding the whole result) if any item
                failed. By default failures are per-item ``error`` entries.
            cache: answer from the result cache of the client's state directory and fill it
                (successes only); None: the client's ``cache`` switch (off by default). An
                answer from the cache has the metric ``cached`` (``item.cached``).

        Returns:
            ``BatchChatCompletionResponse`` whose ``batch[i]`` answers ``messages_batch[i]``.
            A failed item has ``error`` (code, message, HTTP status, param) and no
            ``completion_message``; the other items are unaffected.

        Raises:
            ClientClosedError: outside ``async with``.
            ModelNotFoundError: the provider knows it does not serve ``model``.
            ConfigurationError: arguments that do not fit together (e.g. list lengths).
            BatchFailedError: only with ``raise_on_error=True``.
        """
        ...

    async def schedule_batch(self, file_id: str, **options: Unpack[BatchOptions]) -> Job:
        """Validate an uploaded OpenAI batch JSONL file and run it in the background.

        ``options`` (:class:`~batchclient.BatchOptions`): ``completion_window``, ``metadata``,
        ``reuse_results_from``. Returns at once; ``batches.retrieve(job.job_id)`` has the
        OpenAI batch record. Raises as ``batches.create``.
        """
        ...

    async def job_status(self, job_id: str) -> JobStatus | None:
        """The job's state (``scheduled``, ``in_progress``, ``completed``, ``failed``,
        ``cancelled``; ``expired`` maps to ``failed``), or None for an unknown job."""
        ...

    async def job_cancel(self, job_id: str) -> None:
        """Stop the job, keeping every finished result (``batches.cancel``)."""
        ...

    async def job_result(self, job_id: str) -> BatchChatCompletionResponse:
        """One item per input line, in input order, each with its ``custom_id``; failed lines
        carry ``error``.

        Raises:
            JobNotFoundError: unknown job.
            JobStateError: the job failed validation (see ``batches.retrieve(id).errors``) or
                is not finished yet (``batches.wait`` first).
        """
        ...
