"""Providers' batch APIs as durable providers: OpenAI's Files + Batches API and the APIs shaped
like it, Anthropic Message Batches, Gemini batches (guide: ``docs/batch-api.md``).

One engine runs them all: every call and batch is a local job in the state directory that
owns its remote batches, re-attached after a crash, never submitted twice, its retryable
failures resubmitted up to ``max_attempts``.

- :class:`BatchAPIBatchInference`: the protocol over an OpenAI-shaped Batch API
  (``/v1/files`` + ``/v1/batches``: OpenAI, Together, Groq, Mistral, another
  ``batchclient serve``; :data:`FLAVORS`, chosen with ``flavor=`` or from the base URL's host).
- :class:`AnthropicBatchInference`: the same over Anthropic Message Batches (``anthropic``
  SDK), OpenAI bodies translated both ways.
- :class:`GeminiBatchInference`: the same over the Gemini Batch API (``google-genai`` SDK).
- :class:`RemoteBatchProvider`: any of the three as a :class:`~batchclient.Provider`, and
  :class:`RemoteBatchExecution`: ``BatchClient(provider, execution=...)`` running calls and
  batches as its remote batches.
- :class:`RemoteBatchBackend`: what a provider's batch API implements to run on this engine.
- The options, declared once: :class:`RemoteBatchOptions` (every batch API's), extended by
  :class:`BatchAPIOptions`, :class:`AnthropicBatchOptions`, :class:`GeminiBatchOptions`.
"""

from ._backend import RemoteBatchBackend, RemoteState
from ._clients import AnthropicBatchInference, BatchAPIBatchInference, GeminiBatchInference
from ._execution import RemoteBatchExecution
from ._flavors import FLAVORS
from ._options import AnthropicBatchOptions, BatchAPIOptions, GeminiBatchOptions, RemoteBatchOptions
from ._provider import RemoteBatchProvider

__all__ = [
    "FLAVORS",
    "AnthropicBatchInference",
    "AnthropicBatchOptions",
    "BatchAPIBatchInference",
    "BatchAPIOptions",
    "GeminiBatchInference",
    "GeminiBatchOptions",
    "RemoteBatchBackend",
    "RemoteBatchExecution",
    "RemoteBatchOptions",
    "RemoteBatchProvider",
    "RemoteState",
]
