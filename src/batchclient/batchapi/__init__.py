"""A remote OpenAI Batch API as a provider: OpenAI's discounted batches, or another
``batchclient serve`` (guide: ``docs/batch-api.md``).

- :class:`BatchAPIBatchInference`: the whole protocol (``batch_chat_completion``, files,
  batches, the job calls) over remote ``/v1/files`` + ``/v1/batches``, durable: each call and job
  is a local job that owns its remote batches, re-attached after a crash, never submitted twice.
- :class:`BatchAPIProvider`: the connection as a :class:`~batchclient.Provider`.
"""

from ._client import MAX_BYTES, MAX_LINES, BatchAPIBatchInference, RemoteBatches
from ._provider import BatchAPIProvider

__all__ = ["MAX_BYTES", "MAX_LINES", "BatchAPIBatchInference", "BatchAPIProvider", "RemoteBatches"]
