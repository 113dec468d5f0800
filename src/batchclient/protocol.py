"""``BatchInference``: the one protocol eval code talks to.

The five calls of the original "Batch Inference Support" request to Llama Stack
(``batch_chat_completion``, ``schedule_batch``, ``job_status``, ``job_cancel``, ``job_result``),
plus ``files`` and ``batches`` (OpenAI's Files and Batches APIs in spirit), Llama Stack's
``batch_completion``, the scoring calls evals need (``batch_loglikelihood``,
``batch_loglikelihood_rolling``: lm-evaluation-harness's ``loglikelihood`` requests) and
``batch_embeddings``. Every client
(``BatchClient`` over any provider, ``RemoteBatchInference``, ``VLLMBatchInference``)
implements it, so eval code swaps providers by changing one constructor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, Unpack, runtime_checkable

from .types import (
    BatchChatCompletionResponse,
    BatchCompletionResponse,
    BatchEmbeddingsResponse,
    BatchLoglikelihoodResponse,
    BatchOptions,
    BatchResponse,
    ChatCompletionResponse,
    CompletionResponse,
    EmbeddingResponse,
    EncodingFormat,
    InterleavedContent,
    Job,
    JobStatus,
    LoglikelihoodResponse,
    LogProbConfig,
    MessageLike,
    ProgressCallback,
    ResponseFormatArg,
    SamplingParams,
    ScoringRequest,
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
        on_item: Callable[[int, ChatCompletionResponse], None] | None = None,
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
            on_item: called with ``(index, item)`` as each item finishes (in completion order,
                on the event loop; keep it quick), e.g. to store results as they come. An
                exception it raises ends the call. The same for every call below.
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

    async def batch_completion(
        self,
        model: str,
        content_batch: Sequence[InterleavedContent],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        response_format: ResponseFormatArg | Sequence[ResponseFormatArg] = None,
        logprobs: LogProbConfig | Sequence[LogProbConfig | None] | None = None,
        *,
        custom_ids: Sequence[str] | None = None,
        progress: ProgressCallback | None = None,
        on_item: Callable[[int, CompletionResponse], None] | None = None,
        raise_on_error: bool = False,
        cache: bool | None = None,
    ) -> BatchCompletionResponse:
        """Run one text completion (``/v1/completions``, no chat template) per prompt; return
        the answers in input order (Llama Stack's ``batch_completion``).

        Args:
            model: as for :meth:`batch_chat_completion`.
            content_batch: one prompt per item (text; ``TextContentItem`` lists are joined).
            sampling_params: one for all items or one per item. ``max_tokens=0`` leaves the
                endpoint's default, which for completions is 16 tokens (OpenAI, vLLM servers
                and the inline engine alike).
            response_format: a JSON schema or grammar per item or for all (vLLM endpoints and
                the inline engine honour it on completions; OpenAI's does not).
            logprobs: ``top_k`` alternatives per generated token, per item or for all.
            custom_ids, progress, on_item, raise_on_error, cache: as for
                :meth:`batch_chat_completion`.

        Returns:
            ``BatchCompletionResponse`` whose ``batch[i]`` answers ``content_batch[i]``
            (``content``, ``stop_reason``, ``logprobs``, ``metrics``, or ``error``).

        Raises:
            ClientClosedError, ModelNotFoundError, BatchFailedError: as for chat.
            ConfigurationError: lists not aligned with ``content_batch``, or a provider that
                does not serve ``/v1/completions`` (an inline pooling engine).
        """
        ...

    async def batch_loglikelihood(
        self,
        model: str,
        requests: Sequence[ScoringRequest],
        *,
        custom_ids: Sequence[str] | None = None,
        progress: ProgressCallback | None = None,
        on_item: Callable[[int, LoglikelihoodResponse], None] | None = None,
        raise_on_error: bool = False,
        cache: bool | None = None,
    ) -> BatchLoglikelihoodResponse:
        """Score each continuation given its context (lm-evaluation-harness's
        ``loglikelihood``); return the scores in input order.

        Each request is ``(context, continuation)`` as text, tokenised as
        lm-evaluation-harness does (``docs/evals.md``), or as two lists of token ids. One
        ``/v1/completions`` request per pair asks for the prompt's log-probabilities (vLLM's
        ``prompt_logprobs`` on vLLM endpoints and inline).

        Returns:
            ``BatchLoglikelihoodResponse``: per request ``logprob`` (natural-log sum over the
            continuation's tokens), ``is_greedy``, ``num_tokens``, or ``error``:
            ``invalid_request`` for an empty continuation (or an empty context without a
            prefix token), ``context_length_exceeded`` when context + continuation + 1 token
            is over the model's context (the context is never shortened),
            ``model_not_found`` when the model is only found missing per request.

        Raises:
            ConfigurationError: text requests and no tokenizer (remote: neither
                ``tokenizer=`` nor a ``/tokenize`` route on the server), ``custom_ids`` not
                aligned, or no ``/v1/completions`` on this provider.
            ClientClosedError, ModelNotFoundError, BatchFailedError: as for chat.
        """
        ...

    async def batch_loglikelihood_rolling(
        self,
        model: str,
        texts: Sequence[str],
        *,
        custom_ids: Sequence[str] | None = None,
        progress: ProgressCallback | None = None,
        on_item: Callable[[int, LoglikelihoodResponse], None] | None = None,
        raise_on_error: bool = False,
        cache: bool | None = None,
    ) -> BatchLoglikelihoodResponse:
        """Score each whole text, for perplexity (lm-evaluation-harness's
        ``loglikelihood_rolling``): the text is cut into windows of the model's context, each
        scored given the tokens before it, and summed. Returns one score per text, in input
        order (``num_tokens`` is the text's token count). Errors and raises as
        :meth:`batch_loglikelihood`; the tokenizer must give a BOS or EOS token."""
        ...

    async def batch_embeddings(
        self,
        model: str,
        inputs: Sequence[str | Sequence[int]],
        *,
        encoding_format: EncodingFormat = "float",
        custom_ids: Sequence[str] | None = None,
        progress: ProgressCallback | None = None,
        on_item: Callable[[int, EmbeddingResponse], None] | None = None,
        raise_on_error: bool = False,
        cache: bool | None = None,
    ) -> BatchEmbeddingsResponse:
        """Embed each input (``/v1/embeddings``, one request per input); return the vectors in
        input order.

        Args:
            inputs: texts, or lists of token ids.
            encoding_format: ``"float"`` (a list of floats) or ``"base64"`` (the base64 text
                of little-endian float32, as OpenAI returns it; ``EmbeddingResponse.vector``
                decodes it).

        Returns:
            ``BatchEmbeddingsResponse``: per input ``embedding`` (and ``prompt_tokens`` in
            ``metrics``) or ``error`` (``invalid_request`` for an empty input,
            ``context_length_exceeded`` for an input over the model's context).

        Raises:
            ConfigurationError: a bad ``encoding_format``, or a provider without
                ``/v1/embeddings`` (inline: the engine must be a pooling one,
                ``VLLMBatchInference(runner="pooling", convert="embed")``).
            ClientClosedError, ModelNotFoundError, BatchFailedError: as for chat.
        """
        ...

    async def schedule_batch(self, file_id: str, **options: Unpack[BatchOptions]) -> Job:
        """Validate an uploaded OpenAI batch JSONL file and run it in the background.

        ``options`` (:class:`~batchclient.types.BatchOptions`): ``completion_window``, ``metadata``,
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

    async def job_result(self, job_id: str) -> BatchResponse:
        """One item per input line, in input order, each with its ``custom_id``; failed lines
        carry ``error``. The type follows the batch's endpoint: ``BatchChatCompletionResponse``
        (``/v1/chat/completions``), ``BatchCompletionResponse`` (``/v1/completions``) or
        ``BatchEmbeddingsResponse`` (``/v1/embeddings``).

        Raises:
            JobNotFoundError: unknown job.
            JobStateError: the job failed validation (see ``batches.retrieve(id).errors``) or
                is not finished yet (``batches.wait`` first).
        """
        ...
