"""What every provider shares: the ``async with`` lifecycle, ``batch_chat_completion`` on top
of the request primitive, and (from the jobs module) files and jobs.

A provider subclasses :class:`BaseBatchClient` and supplies ``_start``/``_stop``, ``_execute``
(one :class:`ChatRequest` -> one :class:`ChatResult`, never raising for a per-item failure),
``_check_model`` and ``_window``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, Self

from pydantic import TypeAdapter, ValidationError

from ._scheduler import ProgressCallback, ProgressTracker, run_requests
from ._wire import ChatRequest, ChatResult, build_body, item_error, to_response, tool_to_wire
from .errors import BatchFailedError, ClientClosedError, ConfigurationError, ErrorCode
from .jobs._mixin import JobsMixin
from .types import (
    BatchChatCompletionResponse,
    ChatCompletionResponse,
    JsonSchemaResponseFormat,
    LogProbConfig,
    MessageLike,
    ResponseFormat,
    SamplingParams,
    ToolChoice,
    ToolDefinition,
    ToolPromptFormat,
    coerce_messages,
)


class BaseBatchClient(JobsMixin):
    """Shared machinery of the providers. Not public: use a provider class.

    ``state_dir``: where files, jobs and their results are kept (default: ``$BATCHCLIENT_STATE_DIR``
    or the user data directory, see ``batchclient.jobs.default_state_dir``).
    """

    def __init__(self, *, state_dir: str | os.PathLike[str] | None = None) -> None:
        self._open = False
        self._init_jobs(state_dir)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        await self._start()
        try:
            await self._open_jobs()  # resumes jobs left unfinished in the state directory
        except BaseException:
            await self._stop()
            raise
        self._open = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._open = False
        try:
            await self._close_jobs()  # pauses running jobs: they resume on the next `async with`
        finally:
            await self._stop()

    def _require_open(self) -> None:
        if not self._open:
            raise ClientClosedError(
                f"{type(self).__name__} is not open: use it inside `async with`"
            )

    # ------------------------------------------------------------------ provider hooks

    async def _start(self) -> None:
        raise NotImplementedError

    async def _stop(self) -> None:
        raise NotImplementedError

    async def _execute(self, request: ChatRequest) -> ChatResult:
        raise NotImplementedError

    async def _check_model(self, model: str) -> None:
        """Raise ``ModelNotFoundError`` when ``model`` is known not to be served."""

    def _window(self) -> int:
        """How many requests may be handed to the provider at once."""
        raise NotImplementedError

    def _concurrency_limit(self) -> int | None:
        """The current in-flight limit, for progress reports."""
        return None

    # ------------------------------------------------------------------ the synchronous call

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

        Args:
            model: the model to use (remote: the served model name; inline: ``smollm2`` for the
                bundled model, or the loaded model's path or served name).
            messages_batch: one list of messages per conversation; typed messages or OpenAI-style
                dicts (``{"role": "user", "content": "..."}``).
            sampling_params: one ``SamplingParams`` for all items, or a list aligned with
                ``messages_batch`` (one per item). Default: greedy, provider's max length.
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
        self._require_open()
        n = len(messages_batch)
        per_item_params = _per_item(sampling_params, n)
        formats: list[ResponseFormat | None]
        formats = _aligned("response_format", response_format, n, _coerce_response_format)
        per_item_logprobs: list[LogProbConfig | None]
        per_item_logprobs = _aligned("logprobs", logprobs, n, _coerce_logprobs)
        wire_tools = _wire_tools(tools, tool_choice)
        if tool_prompt_format is not None:
            try:
                tool_prompt_format = ToolPromptFormat(tool_prompt_format)
            except ValueError:
                raise ConfigurationError(
                    f"tool_prompt_format must be one of {[f.value for f in ToolPromptFormat]}"
                ) from None
        if custom_ids is not None and len(custom_ids) != n:
            raise ConfigurationError(
                f"custom_ids has {len(custom_ids)} entries for {n} conversations"
            )
        await self._check_model(model)
        requests = self._build_requests(
            model,
            messages_batch,
            per_item_params,
            tools=wire_tools,
            tool_choice=tool_choice,
            tool_prompt_format=tool_prompt_format,
            response_formats=formats,
            logprobs=per_item_logprobs,
            custom_ids=custom_ids,
        )
        results: list[ChatCompletionResponse | None] = [None] * n
        tracker = ProgressTracker(
            total=n, callback=progress, concurrency_limit=self._concurrency_limit
        )

        async def execute(request: ChatRequest) -> ChatResult:
            tracker.in_flight += 1
            try:
                return await self._execute(request)
            finally:
                tracker.in_flight -= 1

        def on_result(request: ChatRequest, result: ChatResult) -> None:
            response = to_response(request, result)
            results[request.index] = response
            tracker.record(result, response.error is None)

        await run_requests(execute, requests, window=self._window(), on_result=on_result)
        tracker.finish()
        missing = [i for i, r in enumerate(results) if r is None]
        assert not missing, f"items without a result: {missing[:10]}"  # the primitive's contract
        response = BatchChatCompletionResponse(batch=results)  # type: ignore[arg-type]
        if raise_on_error and response.errors:
            raise BatchFailedError(response, response.errors)
        return response

    def _build_requests(
        self,
        model: str,
        messages_batch: Sequence[Sequence[MessageLike]],
        per_item_params: Sequence[SamplingParams],
        *,
        tools: list[dict[str, Any]] | None,
        tool_choice: ToolChoice | str,
        tool_prompt_format: ToolPromptFormat | None,
        response_formats: Sequence[ResponseFormat | None],
        logprobs: Sequence[LogProbConfig | None],
        custom_ids: Sequence[str] | None,
    ) -> Iterator[ChatRequest]:
        """One ``ChatRequest`` per conversation, built lazily. A conversation that cannot be
        turned into a request (malformed message) gets an ``invalid_request`` error instead."""
        tool_schemas = (
            {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
            if tools
            else None
        )
        for i, conversation in enumerate(messages_batch):
            fmt = response_formats[i]
            schema = fmt.json_schema if isinstance(fmt, JsonSchemaResponseFormat) else None
            custom_id = custom_ids[i] if custom_ids is not None else None
            try:
                messages = coerce_messages(list(conversation))
                if not messages:
                    raise ValueError("the conversation has no messages")
            except (ValidationError, ValueError, TypeError) as exc:
                yield ChatRequest(
                    index=i,
                    body={"model": model},
                    custom_id=custom_id,
                    error=item_error(
                        ErrorCode.invalid_request, f"bad conversation: {exc}", param="messages"
                    ),
                )
                continue
            body = build_body(
                model,
                messages,
                per_item_params[i],
                tools=tools,
                tool_choice=tool_choice,
                response_format=fmt,
                logprobs=logprobs[i],
            )
            yield ChatRequest(
                index=i,
                body=body,
                custom_id=custom_id,
                response_schema=schema,
                tool_schemas=tool_schemas,
                tool_prompt_format=tool_prompt_format,
            )


def _wire_tools(
    tools: Sequence[ToolDefinition | dict[str, Any]] | None, tool_choice: ToolChoice | str
) -> list[dict[str, Any]] | None:
    """The tools in OpenAI form, checked against the tool choice (a whole-call problem)."""
    try:
        wire = [tool_to_wire(t) for t in tools] if tools else None
    except ValidationError as exc:
        raise ConfigurationError(f"bad tool definition: {exc}") from exc
    names = [str(t.get("function", {}).get("name")) for t in wire or ()]
    choice = tool_choice.value if isinstance(tool_choice, ToolChoice) else str(tool_choice)
    if choice == "required" and not wire:
        raise ConfigurationError("tool_choice 'required' needs tools")
    if choice not in ("auto", "none", "required") and choice not in names:
        raise ConfigurationError(
            f"tool_choice {choice!r} is not a tool's name; tools: {', '.join(names) or 'none'}"
        )
    return wire


def _per_item(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, n: int
) -> Sequence[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * n
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    params = list(sampling_params)
    if len(params) != n:
        raise ConfigurationError(f"sampling_params has {len(params)} entries for {n} conversations")
    return [
        p if isinstance(p, SamplingParams) else SamplingParams.model_validate(p) for p in params
    ]


ResponseFormatArg = ResponseFormat | dict[str, Any] | None
"""A response format as typed or as a dict (``{"type": "json_schema", "json_schema": {...}}``)."""

_response_format_adapter: TypeAdapter[ResponseFormat] = TypeAdapter(ResponseFormat)


def _aligned(name: str, value: Any, n: int, coerce: Callable[[Any], Any]) -> list[Any]:
    """One value for all ``n`` items, or a list aligned with the conversations."""
    if isinstance(value, list | tuple):
        if len(value) != n:
            raise ConfigurationError(f"{name} has {len(value)} entries for {n} conversations")
        return [coerce(v) for v in value]
    return [coerce(value)] * n


def _coerce_response_format(fmt: ResponseFormatArg) -> ResponseFormat | None:
    if fmt is None or not isinstance(fmt, dict):
        return fmt
    try:
        return _response_format_adapter.validate_python(fmt)
    except ValidationError as exc:
        raise ConfigurationError(f"bad response_format: {exc}") from exc


def _coerce_logprobs(config: LogProbConfig | dict[str, Any] | None) -> LogProbConfig | None:
    if config is None or isinstance(config, LogProbConfig):
        return config
    try:
        return LogProbConfig.model_validate(config)
    except ValidationError as exc:
        raise ConfigurationError(f"bad logprobs: {exc}") from exc
