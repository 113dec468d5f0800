"""A remote OpenAI Batch API as a provider: OpenAI's discounted batches, or another
``batchclient serve`` (guide: ``docs/batch-api.md``).

- :class:`BatchAPIBatchInference`: the whole protocol (``batch_chat_completion``, files,
  batches, the job calls) over remote ``/v1/files`` + ``/v1/batches``, durable: each call and job
  is a local job that owns its remote batches, re-attached after a crash, never submitted twice.
- :class:`BatchAPIProvider`: the connection as a :class:`~batchclient.Provider`.
- :data:`FLAVORS`: the OpenAI-shaped variants it speaks (``openai``, ``together``, ``groq``,
  ``mistral``), chosen with ``flavor=`` or from the base URL's host.
- :class:`AnthropicBatchInference`: the same over Anthropic Message Batches (``anthropic`` SDK),
  OpenAI bodies translated both ways; :class:`AnthropicBatchProvider` its connection.
- :class:`RemoteBatchBackend`: what another provider's batch API implements to run on the same
  durable machinery (parts, remote ids, resubmission, polling, re-attach, cancel), with
  :class:`RemoteJobClient` as its client's base.
- :class:`GeminiBatchInference`: Google's Gemini Batch API on that machinery (the
  ``google-genai`` SDK as the wire; :class:`GeminiBatchProvider` its connection).
"""

from ._anthropic import AnthropicBatchInference, AnthropicBatchOptions, AnthropicBatchProvider
from ._backend import RemoteBatchBackend, RemoteState
from ._client import MAX_BYTES, MAX_LINES, BatchAPIBatchInference, RemoteBatches, RemoteJobClient
from ._flavors import FLAVORS, PRICE_NOTES, flavor_of
from ._gemini_client import GeminiBatchInference, GeminiBatchOptions, GeminiBatchProvider
from ._options import BatchAPIOptions
from ._provider import BatchAPIProvider

__all__ = [
    "FLAVORS",
    "MAX_BYTES",
    "MAX_LINES",
    "PRICE_NOTES",
    "AnthropicBatchInference",
    "AnthropicBatchOptions",
    "AnthropicBatchProvider",
    "BatchAPIBatchInference",
    "BatchAPIOptions",
    "BatchAPIProvider",
    "GeminiBatchInference",
    "GeminiBatchOptions",
    "GeminiBatchProvider",
    "RemoteBatchBackend",
    "RemoteBatches",
    "RemoteJobClient",
    "RemoteState",
    "flavor_of",
]
