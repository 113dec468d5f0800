"""batchclient: batch inference for LLM evaluations.

One protocol, :class:`BatchInference`, over interchangeable providers (:class:`Provider`):

- :class:`RemoteBatchInference`: concurrency-limited fan-out to OpenAI-compatible endpoints;
- :class:`VLLMBatchInference`: a vLLM engine driven in-process (the engine batches everything);
- :class:`RayBatchInference`: vLLM engines as Ray actors, dispatched as remote replicas are;
- :class:`BatchAPIBatchInference`: a remote OpenAI Batch API (``/v1/files`` + ``/v1/batches``:
  OpenAI's discounted batches, or another ``batchclient serve``), durable and resumable;
- :class:`BatchClient`: the same protocol over a provider of your own.

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
from ._core.provider import (
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
from ._version import __version__
from .batchapi import (
    BatchAPIBatchInference,
    BatchAPIProvider,
)
from .distributed import (
    RayBatchInference,
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
    RemoteEndpoint,
    RemoteProvider,
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
    "Batch",
    "BatchAPIBatchInference",
    "BatchAPIProvider",
    "BatchChatCompletionResponse",
    "BatchClient",
    "BatchClientError",
    "BatchCompletionResponse",
    "BatchEmbeddingsResponse",
    "BatchError",
    "BatchErrors",
    "BatchEstimate",
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
    "ChatCompletionResponse",
    "ClientClosedError",
    "CompletionMessage",
    "CompletionResponse",
    "ConfigurationError",
    "Ejection",
    "EmbeddingResponse",
    "EncodingFormat",
    "Endpoint",
    "EndpointError",
    "ErrorCode",
    "FileDeleted",
    "FileNotFoundInStoreError",
    "FileObject",
    "Files",
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
    "RayProvider",
    "RemoteBatchInference",
    "RemoteEndpoint",
    "RemoteProvider",
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
    "VLLMProvider",
    "__version__",
    "failed",
    "item_error",
]
