"""batchclient: batch inference for LLM evaluations.

One protocol, :class:`BatchInference`, over interchangeable providers:

- :class:`RemoteBatchInference`: concurrency-limited fan-out to any OpenAI-compatible endpoint;
- :class:`VLLMBatchInference`: a vLLM engine driven in-process (the engine batches everything).

Both also run OpenAI batch JSONL files as durable, resumable jobs (``files``,
``schedule_batch``, ``job_status``, ``job_info``, ``job_cancel``, ``job_result``; guide:
``docs/jobs.md``) and the ``batchclient`` command runs them from the shell.

    async with RemoteBatchInference("http://127.0.0.1:8000/v1") as client:
        result = await client.batch_chat_completion(
            model="smollm2",
            messages_batch=[[{"role": "user", "content": "Hi"}]],
        )
"""

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
from .inline import VLLMBatchInference
from .protocol import BatchInference
from .remote import RemoteBatchInference, RemoteEndpoint
from .types import (
    BatchChatCompletionResponse,
    BatchItemError,
    BatchJob,
    BatchProgress,
    ChatCompletionResponse,
    CompletionMessage,
    FileObject,
    GrammarResponseFormat,
    GreedySamplingStrategy,
    Job,
    JobErrorEntry,
    JobErrors,
    JobRequestCounts,
    JobStatus,
    JobUsage,
    JsonSchemaResponseFormat,
    LogProbConfig,
    Message,
    MetricInResponse,
    ResponseFormat,
    SamplingParams,
    StopReason,
    SystemMessage,
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

__version__ = "0.1.0"

__all__ = [
    "BatchChatCompletionResponse",
    "BatchClientError",
    "BatchFailedError",
    "BatchInference",
    "BatchItemError",
    "BatchJob",
    "BatchProgress",
    "ChatCompletionResponse",
    "ClientClosedError",
    "CompletionMessage",
    "ConfigurationError",
    "EndpointError",
    "ErrorCode",
    "FileNotFoundInStoreError",
    "FileObject",
    "GrammarResponseFormat",
    "GreedySamplingStrategy",
    "Job",
    "JobError",
    "JobErrorEntry",
    "JobErrors",
    "JobNotFoundError",
    "JobRequestCounts",
    "JobStateError",
    "JobStatus",
    "JobUsage",
    "JsonSchemaResponseFormat",
    "LogProbConfig",
    "Message",
    "MetricInResponse",
    "ModelNotFoundError",
    "RemoteBatchInference",
    "RemoteEndpoint",
    "ResponseFormat",
    "SamplingParams",
    "StopReason",
    "SystemMessage",
    "TokenLogProbs",
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
    "__version__",
]
