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

What a user builds or reads is here; the rest lives in submodules: ``batchclient.types`` (every
protocol type: messages, tools, sampling strategies, metrics), ``batchclient.remote`` (the
remote provider, its options and settings: ``RetryPolicy``, ``AdaptiveConcurrency``, ...),
``batchclient.inline``, ``batchclient.distributed``, ``batchclient.batchapi`` (the providers and
their options), ``batchclient.jobs`` (``Files``, ``Batches``), ``batchclient.server`` and
``batchclient.testing`` (loopback stubs for your own tests).

Every client also runs OpenAI batch JSONL files as durable, resumable batches (``files``,
``batches``, ``schedule_batch``, ``job_status``, ``job_cancel``, ``job_result``; guide:
``docs/jobs.md``), and the ``batchclient`` command runs them from the shell.

    async with RemoteBatchInference("http://127.0.0.1:8000/v1") as client:
        result = await client.batch_chat_completion(
            model="smollm2",
            messages_batch=[[{"role": "user", "content": "Hi"}]],
        )
"""

from ._core.client import BatchClient
from ._core.execution import Call, Execution
from ._core.ledger import PriceTable
from ._core.provider import DelegatingProvider, Provider
from ._core.request import Request, Result, failed
from ._core.tokens import HFTokenizer, Tokenizer
from ._registry import PROVIDERS as _PROVIDERS
from ._registry import make_client, make_provider
from ._version import __version__
from .batchapi import AnthropicBatchInference, BatchAPIBatchInference, GeminiBatchInference
from .distributed import RayBatchInference
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
from .remote import RemoteBatchInference
from .types import (
    Batch,
    BatchChatCompletionResponse,
    BatchCompletionResponse,
    BatchEmbeddingsResponse,
    BatchEstimate,
    BatchItemError,
    BatchLoglikelihoodResponse,
    BatchProgress,
    BatchResponse,
    BatchStatus,
    ChatCompletionResponse,
    CompletionResponse,
    EmbeddingResponse,
    Endpoint,
    FileObject,
    Job,
    JobStatus,
    LoglikelihoodResponse,
    LogProbConfig,
    Message,
    MessageLike,
    ResponseFormat,
    SamplingParams,
    ScoringRequest,
    ToolChoice,
    ToolDefinition,
)

# grouped by what a user does with them, not sorted
__all__ = [  # noqa: RUF022
    # the clients
    "AnthropicBatchInference",
    "BatchAPIBatchInference",
    "GeminiBatchInference",
    "RayBatchInference",
    "RemoteBatchInference",
    "VLLMBatchInference",
    # the protocol, a client over any provider, and a provider of your own
    "BatchClient",
    "BatchInference",
    "Call",
    "DelegatingProvider",
    "Execution",
    "HFTokenizer",
    "Provider",
    "Request",
    "Result",
    "Tokenizer",
    "failed",
    "make_client",
    "make_provider",
    # what a call takes
    "Endpoint",
    "LogProbConfig",
    "Message",
    "MessageLike",
    "ResponseFormat",
    "SamplingParams",
    "ScoringRequest",
    "ToolChoice",
    "ToolDefinition",
    # what it gives back
    "BatchChatCompletionResponse",
    "BatchCompletionResponse",
    "BatchEmbeddingsResponse",
    "BatchItemError",
    "BatchLoglikelihoodResponse",
    "ChatCompletionResponse",
    "CompletionResponse",
    "EmbeddingResponse",
    "LoglikelihoodResponse",
    # files and batches
    "Batch",
    "BatchEstimate",
    "PriceTable",
    "BatchProgress",
    "BatchResponse",
    "BatchStatus",
    "FileObject",
    "Job",
    "JobStatus",
    # errors
    "BatchClientError",
    "BatchFailedError",
    "ClientClosedError",
    "ConfigurationError",
    "EndpointError",
    "ErrorCode",
    "FileNotFoundInStoreError",
    "JobError",
    "JobNotFoundError",
    "JobStateError",
    "ModelNotFoundError",
    "__version__",
]

__doc__ = (__doc__ or "").replace("{names}", ", ".join(f'``"{n}"``' for n in _PROVIDERS))
