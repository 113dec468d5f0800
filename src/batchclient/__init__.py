"""batchclient: batch inference for LLM evaluations.

One protocol, :class:`BatchInference`, over interchangeable providers (:class:`Provider`):

- :class:`RemoteBatchInference`: concurrency-limited fan-out to OpenAI-compatible endpoints;
- :class:`VLLMBatchInference`: a vLLM engine driven in-process (the engine batches everything);
- :class:`RayBatchInference`: vLLM engines as Ray actors, dispatched as remote replicas are;
- :class:`BatchAPIBatchInference`: a remote OpenAI Batch API (``/v1/files`` + ``/v1/batches``:
  OpenAI's discounted batches, or another ``batchclient serve``), durable and resumable;
- :class:`AnthropicBatchInference`: Anthropic Message Batches, as durable, with OpenAI bodies;
- :class:`GeminiBatchInference`: Google's Gemini Batch API, on the same durable machinery;
- :class:`BatchClient`: the same protocol over a provider of your own;
- :func:`make_client` / :func:`make_provider`: any of them by provider name ({names}) and
  options, as ``batchclient run --provider`` does (``batchclient providers`` lists each one's
  options and defaults).

Every client also runs OpenAI batch JSONL files as durable, resumable batches (``files``,
``batches``, ``schedule_batch``, ``job_status``, ``job_cancel``, ``job_result``; guide:
``docs/jobs.md``), and the ``batchclient`` command runs them from the shell.

    async with RemoteBatchInference("http://127.0.0.1:8000/v1") as client:
        result = await client.batch_chat_completion(
            model="smollm2",
            messages_batch=[[{"role": "user", "content": "Hi"}]],
        )
"""

from ._core.client import (
    BatchClient,
)
from ._core.execution import (
    Call,
    Execution,
)
from ._core.provider import (
    DelegatingProvider,
    Provider,
)
from ._core.request import (
    Request,
    Result,
    failed,
    item_error,
)
from ._core.tokens import (
    HFTokenizer,
    Tokenizer,
    TokenizerInfo,
)
from ._registry import (
    PROVIDERS as _PROVIDERS,
)
from ._registry import (
    make_client,
    make_provider,
)
from ._version import __version__
from .batchapi import (
    AnthropicBatchInference,
    AnthropicBatchOptions,
    BatchAPIBatchInference,
    BatchAPIOptions,
    GeminiBatchInference,
    GeminiBatchOptions,
    RemoteBatchProvider,
)
from .distributed import (
    RayBatchInference,
    RayOptions,
    RayProvider,
)
from .errors import (
    BatchClientError,
    BatchFailedError,
    ClientClosedError,
    ConfigurationError,
    EndpointError,
    ErrorCode,
    FileNotFoundInStoreError,
    JobError,
    JobNotFoundError,
    JobStateError,
    ModelNotFoundError,
)
from .inline import (
    VLLMBatchInference,
    VLLMOptions,
    VLLMProvider,
)
from .jobs import (
    Batches,
    Files,
)
from .protocol import (
    BatchInference,
)
from .remote import (
    AdaptiveConcurrency,
    Ejection,
    RateLimits,
    RemoteBatchInference,
    RemoteOptions,
    RemoteProvider,
    RemoteReplica,
    RetryPolicy,
    Timeouts,
)
from .types import (
    Batch,
    BatchChatCompletionResponse,
    BatchCompletionResponse,
    BatchEmbeddingsResponse,
    BatchError,
    BatchErrors,
    BatchEstimate,
    BatchEta,
    BatchItemError,
    BatchLoglikelihoodResponse,
    BatchOptions,
    BatchProgress,
    BatchRequestCounts,
    BatchResponse,
    BatchStatus,
    BatchUsage,
    ChatCompletionResponse,
    CompletionMessage,
    CompletionResponse,
    EmbeddingResponse,
    EncodingFormat,
    Endpoint,
    FileDeleted,
    FileObject,
    GrammarResponseFormat,
    GreedySamplingStrategy,
    ImageContentItem,
    Job,
    JobStatus,
    JsonSchemaResponseFormat,
    LoglikelihoodResponse,
    LogProbConfig,
    Message,
    MessageLike,
    MetricInResponse,
    ProgressCallback,
    ResponseFormat,
    SamplingParams,
    ScoringRequest,
    StopReason,
    SystemMessage,
    TextContentItem,
    TokenLogProbs,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    ToolParamDefinition,
    ToolPromptFormat,
    ToolResponseMessage,
    TopKSamplingStrategy,
    TopPSamplingStrategy,
    UserMessage,
)

__all__ = [
    "AdaptiveConcurrency",
    "AnthropicBatchInference",
    "AnthropicBatchOptions",
    "Batch",
    "BatchAPIBatchInference",
    "BatchAPIOptions",
    "BatchChatCompletionResponse",
    "BatchClient",
    "BatchClientError",
    "BatchCompletionResponse",
    "BatchEmbeddingsResponse",
    "BatchError",
    "BatchErrors",
    "BatchEstimate",
    "BatchEta",
    "BatchFailedError",
    "BatchInference",
    "BatchItemError",
    "BatchLoglikelihoodResponse",
    "BatchOptions",
    "BatchProgress",
    "BatchRequestCounts",
    "BatchResponse",
    "BatchStatus",
    "BatchUsage",
    "Batches",
    "Call",
    "ChatCompletionResponse",
    "ClientClosedError",
    "CompletionMessage",
    "CompletionResponse",
    "ConfigurationError",
    "DelegatingProvider",
    "Ejection",
    "EmbeddingResponse",
    "EncodingFormat",
    "Endpoint",
    "EndpointError",
    "ErrorCode",
    "Execution",
    "FileDeleted",
    "FileNotFoundInStoreError",
    "FileObject",
    "Files",
    "GeminiBatchInference",
    "GeminiBatchOptions",
    "GrammarResponseFormat",
    "GreedySamplingStrategy",
    "HFTokenizer",
    "ImageContentItem",
    "Job",
    "JobError",
    "JobNotFoundError",
    "JobStateError",
    "JobStatus",
    "JsonSchemaResponseFormat",
    "LogProbConfig",
    "LoglikelihoodResponse",
    "Message",
    "MessageLike",
    "MetricInResponse",
    "ModelNotFoundError",
    "ProgressCallback",
    "Provider",
    "RateLimits",
    "RayBatchInference",
    "RayOptions",
    "RayProvider",
    "RemoteBatchInference",
    "RemoteBatchProvider",
    "RemoteOptions",
    "RemoteProvider",
    "RemoteReplica",
    "Request",
    "ResponseFormat",
    "Result",
    "RetryPolicy",
    "SamplingParams",
    "ScoringRequest",
    "StopReason",
    "SystemMessage",
    "TextContentItem",
    "Timeouts",
    "TokenLogProbs",
    "Tokenizer",
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
    "VLLMBatchInference",
    "VLLMOptions",
    "VLLMProvider",
    "__version__",
    "failed",
    "item_error",
    "make_client",
    "make_provider",
]

# the provider names, from the registry itself
__doc__ = (__doc__ or "").replace("{names}", ", ".join(f'``"{n}"``' for n in _PROVIDERS))
