"""``BatchClient``: the ``BatchInference`` protocol over any :class:`Provider`.

The client owns the ``async with`` lifecycle (the provider's start and stop, the job manager of
its state directory), builds the requests of a call (:mod:`.encode`), runs them through the one
primitive (:func:`.scheduler.run_requests`) and decodes each result at its input position
(:mod:`.decode`). Files and batches are ``client.files`` and ``client.batches``; the original
protocol's job calls delegate to them. Guide: ``docs/design.md``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

from anyio import CapacityLimiter

from ..cache._key import number_repeats
from ..errors import BatchFailedError, ClientClosedError, ConfigurationError
from ..jobs import Files, JobManager
from ..jobs._estimate import estimate_file
from ..jobs._store import default_state_dir
from ..types import (
    BatchChatCompletionResponse,
    BatchCompletionResponse,
    BatchEmbeddingsResponse,
    BatchEstimate,
    BatchLoglikelihoodResponse,
    BatchOptions,
    BatchResponse,
    ChatCompletionResponse,
    CompletionResponse,
    EmbeddingResponse,
    EncodingFormat,
    Endpoint,
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
from .calls import check_custom_ids
from .completions import completion_requests, to_completion_response
from .decode import build_response, stage_response
from .embeddings import embedding_requests, to_embedding_response
from .encode import chat_requests
from .execution import Call, Execution
from .ledger import PriceTable
from .prefix import group_by_prefix
from .provider import Provider
from .request import Request, Result
from .scheduler import Execute, ProgressTracker, run_requests
from .scoring import (
    combine_windows,
    encode_pairs,
    loglikelihood_requests,
    rolling_requests,
    to_loglikelihood,
)

__all__ = ["BatchClient"]

R = TypeVar("R")
Decode = Callable[[Request, Result], R]


class BatchClient:
    """Batch inference and durable jobs over ``provider``. Use as ``async with``.

    ``RemoteBatchInference`` and ``VLLMBatchInference`` are this client over their providers;
    ``BatchClient(MyProvider())`` gives a provider of your own the whole protocol.

    Args:
        provider: what runs the requests.
        state_dir: where files, batches and their results are kept (default
            ``$BATCHCLIENT_STATE_DIR`` or the user data directory). Batches left unfinished
            there resume on entering a client whose provider has the same identity.
        cache: answer from the result cache in ``state_dir`` and fill it, for every call and
            batch of this client (default False; each call's and batch's ``cache=`` overrides
            it). Only successful answers are kept; the key is the endpoint, the canonical
            request body, the provider's ``cache_identity`` and a repeat index (guide:
            ``docs/jobs.md``, "Result cache").
        execution: how calls and batches run (:class:`~batchclient.Execution`): live through
            ``provider.execute`` (None, the default), or as remote batches of a provider's
            Batch API (``batchclient.batchapi.RemoteBatchExecution``).
        database: a ``postgresql://`` URL where files, batches and results are kept instead of
            ``state_dir``'s SQLite file (default ``$BATCHCLIENT_DATABASE_URL``, else none), so
            that a batch started on one machine can be read or resumed on another;
            ``state_dir`` then only caches files. Needs ``pip install 'batchclient[postgres]'``
            (guide: ``docs/server.md``, "Many processes").
    """

    def __init__(
        self,
        provider: Provider,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        cache: bool = False,
        execution: Execution | None = None,
        database: str | None = None,
    ) -> None:
        self.provider = provider
        self.database = database
        """The PostgreSQL URL given (see ``database`` above); None: the environment's, or
        SQLite."""
        self.cache = cache
        """The client's result-cache switch (see ``cache`` above)."""
        self.execution = execution if execution is not None else Execution()
        """How the client's calls and batches run (see ``execution`` above)."""
        self._state_dir = (
            Path(state_dir).expanduser() if state_dir is not None else default_state_dir()
        )
        self._jobs: JobManager | None = None
        self.files = Files(lambda: self._manager().store())
        """Upload, list, read and delete files (``create``, ``retrieve``, ``content``, ``path``,
        ``list``, ``delete``)."""
        self.batches = self.execution.batches(self._manager)
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
            manager = JobManager(
                self._state_dir,
                provider=self.provider,
                cache=self.cache,
                runner=self.execution.job_runner(),
                database=self.database,
            )
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
        on_item: Callable[[int, ChatCompletionResponse], None] | None = None,
        raise_on_error: bool = False,
        cache: bool | None = None,
    ) -> BatchChatCompletionResponse:
        """Run one chat completion per conversation; return the answers in input order.

        See :meth:`batchclient.BatchInference.batch_chat_completion` for the arguments, the
        result and the errors raised. ``cache``: use the result cache for this call (None: the
        client's switch); an answer from it has the metric ``cached`` (``item.cached``).
        """
        self._manager()
        self._serves(Endpoint.chat_completions)
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
        batch = await self._run(
            requests,
            len(messages_batch),
            stage_response,
            progress,
            on_item,
            self._cache(cache),
            build=build_response,
        )
        response = BatchChatCompletionResponse(batch=batch)
        if raise_on_error and response.errors:
            raise BatchFailedError(response, response.errors)
        return response

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
        """Run one text completion per prompt; return the answers in input order.

        See :meth:`batchclient.BatchInference.batch_completion`."""
        self._manager()
        self._serves(Endpoint.completions)
        requests = completion_requests(
            model, content_batch, sampling_params, response_format, logprobs, custom_ids
        )
        await self.provider.check_model(model)
        n = len(content_batch)
        batch = await self._run(
            requests, n, to_completion_response, progress, on_item, self._cache(cache)
        )
        return _checked(BatchCompletionResponse(batch=batch), raise_on_error)

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
        """Score each continuation given its context; return the scores in input order.

        See :meth:`batchclient.BatchInference.batch_loglikelihood`."""
        self._manager()
        self._serves(Endpoint.completions)
        n = len(requests)
        check_custom_ids(custom_ids, n, "requests")
        await self.provider.check_model(model)
        texts = any(isinstance(x, str) for r in requests if isinstance(r, tuple | list) for x in r)
        tokenizer = await self.provider.tokenizer(model) if texts else None
        encoded = await encode_pairs(requests, tokenizer)
        limit = (await tokenizer.info()).max_model_len if tokenizer is not None else None
        scoring = loglikelihood_requests(model, encoded, limit, custom_ids)
        batch = await self._run(scoring, n, to_loglikelihood, progress, on_item, self._cache(cache))
        return _checked(BatchLoglikelihoodResponse(batch=batch), raise_on_error)

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
        """Score each whole text (perplexity); return the scores in input order.

        See :meth:`batchclient.BatchInference.batch_loglikelihood_rolling`."""
        self._manager()
        self._serves(Endpoint.completions)
        check_custom_ids(custom_ids, len(texts), "texts")
        await self.provider.check_model(model)
        tokenizer = await self.provider.tokenizer(model)
        windows, owners = await rolling_requests(model, texts, tokenizer, custom_ids)
        owner = {j: i for i, mine in enumerate(owners) for j in mine}
        left = [len(mine) for mine in owners]
        parts: dict[int, LoglikelihoodResponse] = {}

        def window_done(j: int, part: LoglikelihoodResponse) -> None:
            parts[j] = part
            i = owner[j]
            left[i] -= 1
            if left[i] == 0 and on_item is not None:
                on_item(i, combine_windows([parts[k] for k in owners[i]]))

        await self._run(
            windows, len(windows), to_loglikelihood, progress, window_done, self._cache(cache)
        )
        batch = [combine_windows([parts[j] for j in mine]) for mine in owners]
        return _checked(BatchLoglikelihoodResponse(batch=batch), raise_on_error)

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
        """Embed each input; return the vectors in input order.

        See :meth:`batchclient.BatchInference.batch_embeddings`."""
        self._manager()
        self._serves(Endpoint.embeddings)
        requests = embedding_requests(model, inputs, encoding_format, custom_ids)
        await self.provider.check_model(model)
        batch = await self._run(
            requests,
            len(inputs),
            to_embedding_response,
            progress,
            on_item,
            self._cache(cache),
        )
        return _checked(BatchEmbeddingsResponse(batch=batch), raise_on_error)

    def _cache(self, cache: bool | None) -> bool:
        return self.cache if cache is None else cache

    def _serves(self, endpoint: Endpoint) -> None:
        if endpoint not in self.provider.endpoints:
            served = ", ".join(sorted(e.value for e in self.provider.endpoints))
            raise ConfigurationError(
                f"{type(self.provider).__name__} does not serve {endpoint.value} "
                f"(it serves {served})"
            )

    async def _run(
        self,
        requests: Iterable[Request],
        n: int,
        decode: Callable[[Request, Result], Any],
        progress: ProgressCallback | None,
        on_item: Callable[[int, R], None] | None = None,
        cache: bool = False,
        *,
        build: Callable[[Any], R] | None = None,
    ) -> list[R]:
        """Run ``n`` requests (indexes ``0..n-1``) as the client's execution says (live by
        default: :meth:`_run_live`); ``decode`` each result into its slot."""
        call = Call(requests, n, decode, progress, on_item, cache, build)
        return await self.execution.run(call, self._manager, self._run_live)

    async def _run_live(self, call: Call[R]) -> list[R]:
        """Run a call's requests through the provider (behind the result cache with
        ``cache``); ``decode`` each result into its slot (and hand it to ``on_item`` as it
        finishes). Every slot is filled: the primitive reports every request once.

        With ``build``, ``decode`` may return a plain ``tuple`` (a checked answer, staged:
        ``decode.stage_response``) that ``build`` turns into the item; staged items are built
        at the end, in one go (they are built as they finish when ``on_item`` wants them). A
        staged item is a success."""
        requests, n, decode, progress = call.requests, call.n, call.decode, call.progress
        on_item, cache, build = call.on_item, call.cache, call.build
        provider: Provider = self.provider
        if cache:
            provider = await self._manager().cached_provider()
            requests = number_repeats(requests)
        results: list[Any] = [None] * n
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
            staged = build is not None and type(item) is tuple
            if staged and on_item is not None:
                item, staged = build(item), False  # type: ignore[misc]
            results[request.index] = item
            tracker.record(result, staged or getattr(item, "error", None) is None)
            if on_item is not None:
                on_item(request.index, item)

        # the in-flight count is read only by progress reports: without them, no wrapper
        run: Execute = provider.execute if progress is None else execute
        # requests that share a prefix dispatched together, while the engine caches it
        grouped = group_by_prefix(requests)
        await run_requests(
            run, grouped, max_in_flight=provider.max_in_flight(), on_result=on_result
        )
        tracker.finish()
        missing = [i for i, r in enumerate(results) if r is None]
        assert not missing, f"items without a result: {missing[:10]}"  # the primitive's contract
        if build is not None:
            _build_staged(results, build)
        return results

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

    async def job_result(self, job_id: str) -> BatchResponse:
        """One item per input line, in input order, each with its ``custom_id``. For a batch
        that failed after validation (its files could not be written, ...): every committed
        result, and ``batch_failed`` for lines without one."""
        return await self._manager().result(job_id)

    def job_result_pages(
        self, job_id: str, size: int = 500, limiter: CapacityLimiter | None = None
    ) -> AsyncIterator[list[ChatCompletionResponse | CompletionResponse | EmbeddingResponse]]:
        """:meth:`job_result`'s items, ``size`` at a time, in input order: for batches too
        large to hold as one document (memory stays flat; each page is read in a worker
        thread; ``limiter``: how many of those threads at once). The job's state is checked
        when the first page is awaited, which raises what :meth:`job_result` raises."""
        return self._manager().result_pages(job_id, size, limiter)

    # ------------------------------------------------------------------ dry run

    async def estimate(
        self,
        file_id: str,
        *,
        tokenizer: str | os.PathLike[str] | None = None,
        price_input: float | None = None,
        price_output: float | None = None,
        cache: bool | None = None,
        prices: PriceTable | None = None,
    ) -> BatchEstimate:
        """What running the uploaded batch file ``file_id`` would take, without sending
        anything: validation, requests (and how many identical greedy lines would be merged,
        how many the result cache would answer), prompt tokens, the most output tokens and,
        with prices in USD per million tokens, a cost. See :class:`BatchEstimate`.

        Prompt tokens are counted with ``tokenizer`` (a local tokenizer directory), else with
        the provider's own when it is local (``Provider.tokenizer_path``), else estimated
        (``prompt_tokens_estimated``). ``cache``: count cache hits as the run would (None: the
        client's switch). ``prices``: a :class:`~batchclient.PriceTable` to cost the tokens by
        class (input, cached input, cache writes, output) at the provider's tier.

        Raises:
            FileNotFoundInStoreError: unknown ``file_id``.
            ConfigurationError: a ``tokenizer`` that cannot be loaded.
        """
        manager = self._manager()
        path = await self.files.path(file_id)
        use_cache = self.cache if cache is None else cache
        return await estimate_file(
            path,
            self.provider,
            await manager.result_cache() if use_cache else None,
            tokenizer=tokenizer,
            price_input=price_input,
            price_output=price_output,
            prices=prices,
        )


_B = TypeVar("_B", BatchCompletionResponse, BatchLoglikelihoodResponse, BatchEmbeddingsResponse)


def eager(decode: Callable[[Request, Result], Any], build: Callable[[Any], R]) -> Decode[R]:
    """``decode`` whose staged items are built at once: for a ``_run`` of a subclass that
    decodes elsewhere (one that does not keep finished items while requests are in flight)."""

    def decoded(request: Request, result: Result) -> R:
        item = decode(request, result)
        return build(item) if type(item) is tuple else item  # type: ignore[no-any-return]

    return decoded


def _build_staged(results: list[Any], build: Callable[[Any], Any]) -> None:
    """Replace every staged item of ``results`` by ``build(item)``, in one pass at the end of
    the call: while requests were in flight the answers were flat tuples the cycle collector
    does not track, so its collections during the call never rescanned them. The collector is
    left as the process set it (a library does not switch it: code beside the call, such as
    lm-eval, a web app or other threads, would run with it off)."""
    for i, item in enumerate(results):
        if type(item) is tuple:
            results[i] = build(item)


def _checked(response: _B, raise_on_error: bool) -> _B:
    if raise_on_error and response.errors:
        raise BatchFailedError(response, response.errors)
    return response
