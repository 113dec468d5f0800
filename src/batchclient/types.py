"""The protocol's data types (pydantic v2).

They follow the types of the original "Batch Inference Support" request, i.e. Llama Stack's
``llama_stack/apis/inference/inference.py`` of v0.1.5 (see ``docs/design.md``), with three
additions every batch user needs: ``ChatCompletionResponse.error`` (a per-item failure),
``ChatCompletionResponse.custom_id`` (the caller's id for the item) and the job records in the
OpenAI Batch API's shapes, named as the openai SDK names them (``Batch``, ``BatchError``,
``BatchRequestCounts``, ``BatchUsage``, ``FileObject``, ``FileDeleted``).

Plain OpenAI-style dict messages (``{"role": "user", "content": "..."}``) are accepted wherever a
``Message`` is: :func:`coerce_messages` turns them into the typed form.
"""

from __future__ import annotations

import array
import base64
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum, nonmember
from typing import Annotated, Any, Literal, TypedDict

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
)

__all__ = [
    "Batch",
    "BatchChatCompletionResponse",
    "BatchCompletionResponse",
    "BatchEmbeddingsResponse",
    "BatchError",
    "BatchErrors",
    "BatchEstimate",
    "BatchEta",
    "BatchItemError",
    "BatchLoglikelihoodResponse",
    "BatchModerationResponse",
    "BatchOptions",
    "BatchProgress",
    "BatchRequestCounts",
    "BatchResponse",
    "BatchStatus",
    "BatchUsage",
    "ChatCompletionResponse",
    "CompletionMessage",
    "CompletionResponse",
    "Cost",
    "EmbeddingResponse",
    "EncodingFormat",
    "Endpoint",
    "FileDeleted",
    "FileObject",
    "GrammarResponseFormat",
    "GreedySamplingStrategy",
    "ImageContentItem",
    "InputTokensDetails",
    "InterleavedContent",
    "Job",
    "JobStatus",
    "JsonSchemaResponseFormat",
    "LogProbConfig",
    "LoglikelihoodResponse",
    "Message",
    "MessageLike",
    "MetricInResponse",
    "ModerationResponse",
    "OutputTokensDetails",
    "ProgressCallback",
    "ResponseFormat",
    "ResponseFormatArg",
    "SamplingParams",
    "SamplingStrategy",
    "ScoringRequest",
    "StopReason",
    "SystemMessage",
    "TextContentItem",
    "Tier",
    "TokenLogProbs",
    "TokenizerInfo",
    "ToolCall",
    "ToolChoice",
    "ToolDefinition",
    "ToolParamDefinition",
    "ToolPromptFormat",
    "ToolResponseMessage",
    "TopKSamplingStrategy",
    "TopPSamplingStrategy",
    "UserMessage",
    "coerce_messages",
    "parse_arguments",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


# ---------------------------------------------------------------------------- content and messages


class TextContentItem(_Model):
    type: Literal["text"] = "text"
    text: str


class ImageContentItem(_Model):
    """An image given by URL (``https://`` or ``data:`` URI)."""

    type: Literal["image"] = "image"
    url: str


InterleavedContent = (
    str | TextContentItem | ImageContentItem | list[TextContentItem | ImageContentItem]
)


class UserMessage(_Model):
    role: Literal["user"] = "user"
    content: InterleavedContent
    context: InterleavedContent | None = None


class SystemMessage(_Model):
    role: Literal["system"] = "system"
    content: InterleavedContent


class ToolResponseMessage(_Model):
    role: Literal["tool"] = "tool"
    call_id: str
    tool_name: str = ""
    content: InterleavedContent


class StopReason(StrEnum):
    """Why generation stopped. OpenAI ``finish_reason`` maps as stop -> ``end_of_turn``,
    length -> ``out_of_tokens``, tool_calls -> ``end_of_message``."""

    end_of_turn = "end_of_turn"
    end_of_message = "end_of_message"
    out_of_tokens = "out_of_tokens"


class ToolCall(_Model):
    call_id: str
    tool_name: str
    arguments: dict[str, Any]


class CompletionMessage(_Model):
    role: Literal["assistant"] = "assistant"
    content: InterleavedContent = ""
    stop_reason: StopReason = StopReason.end_of_turn
    tool_calls: list[ToolCall] = Field(default_factory=list)


Message = Annotated[
    UserMessage | SystemMessage | ToolResponseMessage | CompletionMessage,
    Field(discriminator="role"),
]
"""One conversation turn, discriminated by ``role`` (user, system, tool, assistant)."""

MessageLike = Message | dict[str, Any]
"""A typed :data:`Message` or a plain OpenAI-style dict message."""

_message_adapter: TypeAdapter[Message] = TypeAdapter(Message)


def _coerce_one(message: MessageLike) -> Message:
    if isinstance(message, UserMessage | SystemMessage | ToolResponseMessage | CompletionMessage):
        return message
    if not isinstance(message, dict):
        raise TypeError(f"a message must be a Message or a dict, not {type(message).__name__}")
    data = dict(message)
    role = data.get("role")
    if role == "developer":  # OpenAI's newer name for the system role
        data["role"] = "system"
    elif role == "tool":
        # OpenAI wire form: {"role": "tool", "tool_call_id": ..., "content": ...}
        if "tool_call_id" in data:
            data["call_id"] = data.pop("tool_call_id")
        data.pop("name", None)
    elif role == "assistant":
        if data.get("content") is None:
            data["content"] = ""
        wire_calls = data.pop("tool_calls", None) or []
        calls = []
        for call in wire_calls:
            if isinstance(call, dict) and "function" in call:
                fn = call["function"]
                calls.append(
                    {
                        "call_id": call.get("id", ""),
                        "tool_name": fn.get("name", ""),
                        "arguments": parse_arguments(fn.get("arguments")),
                    }
                )
            else:
                calls.append(call)
        data["tool_calls"] = calls
        data.pop("name", None)
        data.pop("refusal", None)
    elif role in ("user", "system"):
        data.pop("name", None)
    if isinstance(data.get("content"), list):
        data["content"] = [_coerce_part(p) for p in data["content"]]
    return _message_adapter.validate_python(data)


def parse_arguments(raw: Any) -> dict[str, Any]:
    """Tool-call arguments as a dict. OpenAI sends a JSON string; anything that is not a JSON
    object raises ``ValueError``."""
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    value = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(value, dict):
        raise ValueError(f"tool-call arguments are not a JSON object: {raw!r}")
    return value


def _coerce_part(part: Any) -> Any:
    """OpenAI content parts (``{"type": "image_url", "image_url": {"url": ...}}``) to ours."""
    if isinstance(part, dict) and part.get("type") == "image_url":
        image = part.get("image_url") or {}
        return {"type": "image", "url": image.get("url", "") if isinstance(image, dict) else image}
    return part


def coerce_messages(messages: list[MessageLike]) -> list[Message]:
    """Validate one conversation, accepting typed messages and OpenAI-style dicts.

    Raises ``pydantic.ValidationError`` (a ``ValueError``) for a message of no known shape.
    """
    if not isinstance(messages, list):
        raise TypeError(f"a conversation must be a list of messages, not {type(messages).__name__}")
    return [_coerce_one(m) for m in messages]


# ---------------------------------------------------------------------------- sampling


class GreedySamplingStrategy(_Model):
    type: Literal["greedy"] = "greedy"


class TopPSamplingStrategy(_Model):
    type: Literal["top_p"] = "top_p"
    temperature: float = Field(default=1.0, gt=0.0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)


class TopKSamplingStrategy(_Model):
    type: Literal["top_k"] = "top_k"
    top_k: int = Field(ge=1)
    temperature: float = Field(default=1.0, gt=0.0)


SamplingStrategy = Annotated[
    GreedySamplingStrategy | TopPSamplingStrategy | TopKSamplingStrategy,
    Field(discriminator="type"),
]


class SamplingParams(_Model):
    """How to sample. ``max_tokens=0`` means "not set": the provider's default, up to the
    context length. ``stop`` lists strings that end generation (not included in the output).
    ``ignore_eos`` (a vLLM extension, for benchmarks: sent as the ``ignore_eos`` body field,
    which vLLM servers and the inline engine honour) keeps generating past the end-of-sequence
    token until ``max_tokens``."""

    strategy: SamplingStrategy = Field(default_factory=GreedySamplingStrategy)
    max_tokens: int = Field(default=0, ge=0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    stop: list[str] | None = None
    ignore_eos: bool = False


# ---------------------------------------------------------------------------- tools


class ToolParamDefinition(_Model):
    param_type: str
    description: str | None = None
    required: bool = True
    default: Any = None


class ToolDefinition(_Model):
    tool_name: str
    description: str | None = None
    parameters: dict[str, ToolParamDefinition] | None = None


class ToolChoice(StrEnum):
    """``auto``: the model decides; ``required``: it must call a tool; ``none``: no tool call.
    A tool's name (a plain ``str``) may be passed instead to force that tool."""

    auto = "auto"
    required = "required"
    none = "none"


class ToolPromptFormat(StrEnum):
    """How tool definitions and calls are written into the prompt for models without a native
    tool template (Llama Stack's formats)."""

    json = "json"
    function_tag = "function_tag"
    python_list = "python_list"


# ---------------------------------------------------------------------------- response format


class JsonSchemaResponseFormat(_Model):
    type: Literal["json_schema"] = "json_schema"
    json_schema: dict[str, Any]


class GrammarResponseFormat(_Model):
    """A grammar in the engine's grammar language (vLLM: GBNF / EBNF), given as
    ``{"grammar": "<text>"}`` (Llama Stack's ``bnf: dict``)."""

    type: Literal["grammar"] = "grammar"
    bnf: dict[str, Any]


ResponseFormat = Annotated[
    JsonSchemaResponseFormat | GrammarResponseFormat, Field(discriminator="type")
]

ResponseFormatArg = ResponseFormat | dict[str, Any] | None
"""A response format as typed or as a dict (``{"type": "json_schema", "json_schema": {...}}``)."""


# ---------------------------------------------------------------------------- logprobs and metrics


class LogProbConfig(_Model):
    """Ask for log-probabilities: ``top_k`` alternatives per generated token (0 = only the
    sampled token)."""

    top_k: int = Field(default=0, ge=0)


class TokenLogProbs(_Model):
    """One generated token: ``{token text: natural-log probability}`` for the sampled token and
    its top-k alternatives."""

    logprobs_by_token: dict[str, float]


class MetricInResponse(_Model):
    """A per-item figure: ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` and, where
    the answer reports it, ``cached_tokens`` (the prompt tokens read from a prompt cache; unit
    ``tokens``), ``time_to_first_token`` and ``latency`` (unit ``s``, from dispatch), and
    ``cached`` (value 1, no unit) when the result cache gave the answer."""

    metric: str
    value: float
    unit: str | None = None


# ---------------------------------------------------------------------------- responses


class BatchItemError(_Model):
    """Why one item of a batch failed. ``code`` is one of the codes in
    :mod:`batchclient.errors` (``ErrorCode``) or an upstream API's own code; ``status_code`` is
    the HTTP status where there was an HTTP answer; ``param`` names the offending field."""

    code: str
    message: str
    status_code: int | None = None
    param: str | None = None
    raw_output: str | None = Field(
        default=None,
        description="the model's raw text, for invalid structured output or tool calls",
    )


class ChatCompletionResponse(_Model):
    """The answer to one conversation: exactly one of ``completion_message`` and ``error``
    is set."""

    completion_message: CompletionMessage | None = None
    logprobs: list[TokenLogProbs] | None = None
    metrics: list[MetricInResponse] | None = None
    error: BatchItemError | None = None
    custom_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def text(self) -> str:
        """The answer's text ("" for an error or non-text content)."""
        msg = self.completion_message
        if msg is None:
            return ""
        if isinstance(msg.content, str):
            return msg.content
        if isinstance(msg.content, TextContentItem):
            return msg.content.text
        if isinstance(msg.content, list):
            return "".join(p.text for p in msg.content if isinstance(p, TextContentItem))
        return ""

    @property
    def cached(self) -> bool:
        """Whether the result cache gave this answer (its ``cached`` metric)."""
        return self.metric("cached") == 1

    def metric(self, name: str) -> float | None:
        """The value of the metric called ``name``, or None."""
        for m in self.metrics or ():
            if m.metric == name:
                return m.value
        return None


class BatchChatCompletionResponse(_Model):
    """``batch`` has exactly one entry per input conversation, in input order."""

    batch: list[ChatCompletionResponse]

    @property
    def errors(self) -> list[tuple[int, BatchItemError]]:
        """(index, error) for every failed item."""
        return [(i, r.error) for i, r in enumerate(self.batch) if r.error is not None]


class CompletionResponse(_Model):
    """The answer to one prompt of ``batch_completion`` (Llama Stack's ``CompletionResponse``):
    ``content`` is the generated text, ``logprobs`` one entry per generated token when asked
    for. A failed item has ``error`` set, ``content`` empty and ``stop_reason`` None."""

    content: str = ""
    stop_reason: StopReason | None = None
    logprobs: list[TokenLogProbs] | None = None
    metrics: list[MetricInResponse] | None = None
    error: BatchItemError | None = None
    custom_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def metric(self, name: str) -> float | None:
        """The value of the metric called ``name``, or None."""
        return next((m.value for m in self.metrics or () if m.metric == name), None)

    @property
    def cached(self) -> bool:
        """Whether the result cache gave this answer (its ``cached`` metric)."""
        return self.metric("cached") == 1


class BatchCompletionResponse(_Model):
    """``batch`` has exactly one entry per input prompt, in input order (Llama Stack's
    ``BatchCompletionResponse``)."""

    batch: list[CompletionResponse]

    @property
    def errors(self) -> list[tuple[int, BatchItemError]]:
        """(index, error) for every failed item."""
        return [(i, r.error) for i, r in enumerate(self.batch) if r.error is not None]


class LoglikelihoodResponse(_Model):
    """The score of one continuation (lm-evaluation-harness's ``loglikelihood`` answer).

    ``logprob`` is the sum of the natural-log probabilities of the continuation's tokens given
    everything before them; ``is_greedy`` whether each of those tokens is the model's most
    likely next token (greedy decoding would produce the continuation); ``num_tokens`` how many
    tokens were scored. For ``batch_loglikelihood_rolling`` the continuation is the whole text.
    A failed item has ``error`` set and the three figures None.
    """

    logprob: float | None = None
    is_greedy: bool | None = None
    num_tokens: int | None = None
    error: BatchItemError | None = None
    custom_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class BatchLoglikelihoodResponse(_Model):
    """``batch`` has exactly one entry per input request (or text), in input order."""

    batch: list[LoglikelihoodResponse]

    @property
    def errors(self) -> list[tuple[int, BatchItemError]]:
        """(index, error) for every failed item."""
        return [(i, r.error) for i, r in enumerate(self.batch) if r.error is not None]


class EmbeddingResponse(_Model):
    """The embedding of one input (an OpenAI ``Embedding``'s vector).

    ``embedding`` is a list of floats, or with ``encoding_format="base64"`` the base64 text of
    the little-endian float32 array, exactly as OpenAI's ``/v1/embeddings`` returns it;
    :attr:`vector` gives the floats either way. ``metrics`` has ``prompt_tokens``. A failed
    item has ``error`` set and ``embedding`` None.
    """

    embedding: list[float] | str | None = None
    metrics: list[MetricInResponse] | None = None
    error: BatchItemError | None = None
    custom_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def vector(self) -> list[float]:
        """The embedding as floats (decoded from base64 when it came that way); [] on error."""
        value = self.embedding
        if value is None:
            return []
        if isinstance(value, str):
            raw = base64.b64decode(value)
            floats = array.array("f", raw)
            if sys.byteorder == "big":  # OpenAI's base64 is little-endian float32
                floats.byteswap()
            return floats.tolist()
        return list(value)

    def metric(self, name: str) -> float | None:
        """The value of the metric called ``name``, or None."""
        return next((m.value for m in self.metrics or () if m.metric == name), None)

    @property
    def cached(self) -> bool:
        """Whether the result cache gave this answer (its ``cached`` metric)."""
        return self.metric("cached") == 1


class BatchEmbeddingsResponse(_Model):
    """``batch`` has exactly one entry per input, in input order (Llama Stack's
    ``EmbeddingsResponse``, one item per input with its own error)."""

    batch: list[EmbeddingResponse]

    @property
    def errors(self) -> list[tuple[int, BatchItemError]]:
        """(index, error) for every failed item."""
        return [(i, r.error) for i, r in enumerate(self.batch) if r.error is not None]

    @property
    def embeddings(self) -> list[list[float]]:
        """Every item's vector in input order ([] for a failed item)."""
        return [r.vector for r in self.batch]


class ModerationResponse(_Model):
    """The moderation of one input: ``results``, the OpenAI ``ModerationCreateResponse``'s
    ``results`` (one ``Moderation`` object per input text or image, as the server sent them).
    A failed item has ``error`` set and ``results`` None."""

    results: list[dict[str, Any]] | None = None
    metrics: list[MetricInResponse] | None = None
    error: BatchItemError | None = None
    custom_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def flagged(self) -> bool:
        """Whether any of the item's results is flagged (False on error)."""
        return any(bool(r.get("flagged")) for r in self.results or ())

    def metric(self, name: str) -> float | None:
        """The value of the metric called ``name``, or None."""
        return next((m.value for m in self.metrics or () if m.metric == name), None)

    @property
    def cached(self) -> bool:
        """Whether the result cache gave this answer (its ``cached`` metric)."""
        return self.metric("cached") == 1


class BatchModerationResponse(_Model):
    """``batch`` has exactly one entry per ``/v1/moderations`` line, in input order."""

    batch: list[ModerationResponse]

    @property
    def errors(self) -> list[tuple[int, BatchItemError]]:
        """(index, error) for every failed item."""
        return [(i, r.error) for i, r in enumerate(self.batch) if r.error is not None]


BatchResponse = (
    BatchChatCompletionResponse
    | BatchCompletionResponse
    | BatchEmbeddingsResponse
    | BatchModerationResponse
)
"""A job's results (``job_result``), by the batch's endpoint: chat completions (and Responses
lines, each as the chat answer it stands for), completions, embeddings or moderations."""

ScoringRequest = tuple[str, str] | tuple[list[int], list[int]]
"""One ``batch_loglikelihood`` request: ``(context, continuation)`` as text, or as token ids
already encoded (then no tokenizer is needed)."""

EncodingFormat = Literal["float", "base64"]
"""How embeddings come back (OpenAI's ``encoding_format``)."""


class BatchProgress(_Model):
    """A progress report for a running batch or job. Tokens are counted from the ``usage`` of
    answers generated for it (not of answers from the result cache; ``cached_tokens``: the
    prompt tokens read from a provider's prompt cache); ``cache_hits`` counts the
    items the cache answered (they are also in ``completed``); ``concurrency_limit`` is the
    current number of requests allowed in flight (adaptive on the remote provider, fixed
    otherwise)."""

    total: int | None
    completed: int = 0
    failed: int = 0
    cache_hits: int = 0
    in_flight: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    elapsed_s: float = 0.0
    concurrency_limit: int | None = None

    @property
    def done(self) -> int:
        return self.completed + self.failed

    @property
    def output_tokens_per_s(self) -> float:
        return self.completion_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


ProgressCallback = Callable[[BatchProgress], None]
"""Receives a :class:`BatchProgress` at most every 0.2 s while a batch runs, and once at the end."""


# ---------------------------------------------------------------------------- endpoints and jobs


class Endpoint(StrEnum):
    """The OpenAI API path a request is for: an OpenAI batch line's ``url`` and a batch's
    ``endpoint``."""

    chat_completions = "/v1/chat/completions"
    completions = "/v1/completions"
    embeddings = "/v1/embeddings"
    responses = "/v1/responses"
    moderations = "/v1/moderations"

    @property
    def path(self) -> str:
        """The path below an API root that ends in ``/v1`` (``/chat/completions``): what a
        client appends to its base URL."""
        return self.value.removeprefix("/v1")


class Job(_Model):
    """A scheduled job (the original protocol's handle): ``job_id`` is the batch's ``id``."""

    job_id: str


class JobStatus(StrEnum):
    """The original request's job states. The OpenAI-shaped :class:`Batch` carries the finer
    :class:`BatchStatus`; they map as validating -> scheduled, in_progress / finalizing /
    cancelling -> in_progress, expired -> failed."""

    scheduled = "scheduled"
    in_progress = "in_progress"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"


class BatchStatus(StrEnum):
    """An OpenAI batch's status: ``validating -> in_progress -> finalizing -> completed``;
    ``validating -> failed`` (input refused); ``in_progress -> expired`` (completion window
    passed); ``... -> cancelling -> cancelled``."""

    validating = "validating"
    in_progress = "in_progress"
    finalizing = "finalizing"
    completed = "completed"
    failed = "failed"
    cancelling = "cancelling"
    cancelled = "cancelled"
    expired = "expired"

    # The two sets every status falls in, once for the whole package (plain strings, equal to
    # the members: ``"completed" in BatchStatus.TERMINAL`` and the SQL ``IN`` lists work too).
    TERMINAL = nonmember(frozenset({"completed", "failed", "cancelled", "expired"}))
    """The finished statuses: nothing changes after them."""
    ACTIVE = nonmember(frozenset({"validating", "in_progress", "finalizing", "cancelling"}))
    """The unfinished statuses: the batch may still be running (or be resumed)."""

    @property
    def terminal(self) -> bool:
        """Whether the batch is finished (completed, failed, cancelled or expired)."""
        return self in BatchStatus.TERMINAL

    @property
    def active(self) -> bool:
        """Whether the batch is unfinished (validating, in progress, finalizing, cancelling)."""
        return self in BatchStatus.ACTIVE


class BatchRequestCounts(_Model):
    """Requests of a batch: ``total`` lines, ``completed`` and ``failed`` so far (they only
    grow; ``completed + failed == total`` once finished)."""

    total: int = 0
    completed: int = 0
    failed: int = 0


class InputTokensDetails(_Model):
    """Input read from a prompt cache (``cached_tokens``, as OpenAI reports it) and written to
    one (``cache_write_tokens``: batchclient's, from Anthropic's cache writes; OpenAI's shape
    has no such field)."""

    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(_Model):
    reasoning_tokens: int = 0


class BatchUsage(_Model):
    """Tokens used by a batch's finished requests (from each answer's ``usage``):
    ``input_tokens`` all of the prompts, of which ``input_tokens_details`` the cached and
    cache-written ones; ``output_tokens``, of which ``output_tokens_details.reasoning_tokens``
    spent reasoning."""

    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int = 0


class BatchError(_Model):
    """One validation error of an input file (OpenAI: ``errors.data[]``); ``line`` is the
    1-based physical line number."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None


class BatchErrors(_Model):
    """The validation errors of a refused input file (OpenAI: ``errors: {object, data}``)."""

    object: Literal["list"] = "list"
    data: list[BatchError] = Field(default_factory=list)


class BatchEta(_Model):
    """How far a running batch is (not an OpenAI field; see :attr:`Batch.progress`).

    ``completed_fraction``: finished lines (completed + failed) / total, 0 to 1.
    ``requests_per_s``: lines finished per second, smoothed (an exponentially weighted average
    in time of the rates between observations, 30 s time constant, normalised: the average since
    the run's first result while the batch is young); None before any line finished. ``eta_s``:
    seconds until every line is finished at that rate (remaining / ``requests_per_s``); None
    while the rate is unknown."""

    completed_fraction: float
    requests_per_s: float | None = None
    eta_s: float | None = None


class Batch(_Model):
    """The OpenAI Batch object (``/v1/batches``, ``openai.types.Batch``); timestamps are unix
    seconds."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str = Endpoint.chat_completions.value
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str = "24h"
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts = Field(default_factory=BatchRequestCounts)
    metadata: dict[str, str] | None = None
    usage: BatchUsage = Field(default_factory=BatchUsage)
    model: str | None = None
    cache_hits: int = 0
    """Requests the result cache answered instead of the provider (also counted in
    ``request_counts.completed``; lines merged into such a request are marked ``cached`` but
    not counted again). Not an OpenAI field: it is left out of the JSON while it is 0, so a
    batch that used no cache has exactly the OpenAI object's fields."""
    progress: BatchEta | None = None
    """Completion rate and estimated time to finish while the batch is ``in_progress`` or
    ``finalizing`` with a known line count (:class:`BatchEta`). Not an OpenAI field: left
    out of the JSON while None (every other status); the openai SDK keeps it in
    ``batch.model_extra["progress"]``."""

    @model_serializer(mode="wrap")
    def _openai_shape(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.cache_hits:
            data.pop("cache_hits", None)
        if self.progress is None:
            data.pop("progress", None)
        return data


class BatchOptions(TypedDict, total=False):
    """How to run a batch (``schedule_batch(file_id, **options)``, ``batches.create``).

    - ``completion_window``: how long the batch may run, counted from its creation: a number and
      a unit, ``"24h"`` (default; the only value OpenAI accepts), ``"30m"``, ``"5s"``, ``"2d"``.
      After it the batch is ``expired``: finished results are kept, the rest fail with
      ``batch_expired``.
    - ``metadata``: up to 16 string pairs (keys <= 64, values <= 512 characters; OpenAI's
      limits).
    - ``reuse_results_from``: the id of an earlier batch over the same file content whose
      successful results are copied instead of being sent again.
    - ``cache``: answer from the result cache and fill it (None or absent: the client's
      ``cache`` switch). Recorded with the batch, so a resumed batch keeps it.
    - ``output_expires_after_s``: the batch's output and error files expire this many seconds
      after the batch was created (OpenAI's ``output_expires_after`` with the ``created_at``
      anchor): their ``expires_at`` says when, and after it they are deleted (None or absent:
      kept until deleted).
    """

    completion_window: str
    metadata: dict[str, str] | None
    reuse_results_from: str | None
    cache: bool | None
    output_expires_after_s: int | None


Tier = Literal["batch", "flex", "standard", "local"]
"""How a provider bills requests: ``batch`` (the batch APIs), ``flex`` (``service_tier="flex"``),
``standard`` (live calls), ``local`` (an engine run here)."""


class Cost(_Model):
    """What tokens cost at a price table's prices (``batchclient.PriceTable``): ``input`` (input
    read from no cache), ``cached_input``, ``cache_write``, ``output`` and their ``total``, in
    ``currency``; the table's ``as_of`` date, the ``model`` and ``tier`` priced."""

    model: str
    tier: Tier
    currency: str
    as_of: str
    input: float
    cached_input: float
    cache_write: float
    output: float
    total: float


class BatchEstimate(_Model):
    """What running a batch file would take (``client.estimate``, ``batchclient run
    --dry-run``); nothing is sent.

    - ``errors``: the file's validation errors (empty when it would run; then everything else
      is counted); ``requests``: its request lines.
    - ``merged``: identical greedy lines that would get the answer of an earlier identical line;
      ``cache_hits``: lines the result cache holds an answer for (with ``cache`` off they are
      sent anyway: ``cache`` says whether they are counted out); ``to_send``: what would be
      sent.
    - ``prompt_tokens`` and ``max_output_tokens``: over the requests that would be sent;
      ``max_output_tokens`` sums their ``max_tokens`` (or ``max_completion_tokens``), and
      ``without_max_tokens`` counts those without a cap (bounded only by the context, counted
      as 0). ``tokenizer`` names what counted the prompts; with ``prompt_tokens_estimated`` it
      is an estimate (about 4 characters per token plus 3 per message and 3 for the reply:
      OpenAI's rule of thumb and its cookbook's per-message overhead).
    - ``input_cost_usd``, ``output_cost_usd``, ``cost_usd``: with prices in USD per million
      tokens; the output cost is at ``max_output_tokens``, an upper bound.
    - ``tier`` (``batch``, ``flex``, ``standard``, ``local``), ``cached_input_tokens`` and
      ``cache_write_tokens``: how the provider bills and how much of ``prompt_tokens`` its prompt
      cache would read and write (a chat prefix, every message but the last, that later requests
      share and that reaches the provider's shortest cacheable prefix: read by every request but
      the first; written by the first where writes are billed apart). ``cost``: at a price
      table's prices (``--prices``), by class, the output at ``max_output_tokens``.
    """

    requests: int = 0
    errors: list[BatchError] = Field(default_factory=list)
    merged: int = 0
    cache: bool = False
    cache_hits: int = 0
    to_send: int = 0
    prompt_tokens: int = 0
    prompt_tokens_estimated: bool = True
    tokenizer: str | None = None
    max_output_tokens: int = 0
    without_max_tokens: int = 0
    price_input: float | None = None
    price_output: float | None = None
    input_cost_usd: float | None = None
    output_cost_usd: float | None = None
    cost_usd: float | None = None
    tier: str = "standard"
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    cost: Cost | None = None

    @property
    def ok(self) -> bool:
        """Whether the file would run (it passed validation)."""
        return not self.errors


class FileObject(_Model):
    """A stored file (OpenAI ``/v1/files`` shape, ``openai.types.FileObject``); ``bytes`` is its
    size, ``created_at`` unix seconds, ``purpose`` ``batch`` for inputs and ``batch_output`` for
    files the jobs write. ``expires_at``: None (kept until deleted), or for the output and
    error files of a batch created with ``output_expires_after_s``, when they are deleted
    (unix seconds); ``status`` and
    ``status_details`` are kept for the SDK's shape (OpenAI marks both deprecated)."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str = "batch"
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileDeleted(_Model):
    """The answer to deleting a file (``openai.types.FileDeleted``)."""

    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


@dataclass(frozen=True)
class TokenizerInfo:
    """Facts about a tokenizer that scoring rules need.

    ``max_model_len`` is the model's context in tokens (prompt + output), None when unknown;
    ``bos_token`` / ``bos_token_id`` / ``eos_token_id`` its special tokens (None when it has
    none or they are unknown).
    """

    max_model_len: int | None = None
    bos_token: str | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    @property
    def prefix_token_id(self) -> int | None:
        """The token an empty context stands for: BOS, else EOS (lm-evaluation-harness's
        ``prefix_token_id``, ``lm_eval/models/vllm_causallms.py``)."""
        return self.bos_token_id if self.bos_token_id is not None else self.eos_token_id
