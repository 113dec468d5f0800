"""Real servers on loopback for tests, demos and benchmarks.

- :func:`vllm_server`, :func:`free_port`: the real vLLM OpenAI server in a child process group,
  started and torn down by a plain context manager.
- :class:`StubServer`, :class:`Fault`, :class:`StubReply`: an OpenAI-compatible stub server with
  latency, a capacity (refused with 429 or 503, at once or after working, changing mid-run), a
  quota announced in ``x-ratelimit-*`` headers (OpenAI, Azure or gateway style),
  ``Retry-After``, 5xx bursts, connection resets and malformed bodies on demand, in a
  background thread;
  :class:`StubProcess` runs it as its own process (``python -m batchclient.testing stub
  --help``).
- :class:`BatchAPIStub`: an OpenAI Batch API (``/v1/files`` + ``/v1/batches``) that runs batches
  for real and misbehaves on demand (validation failures, expiry with partial output, 5xx / 429
  on polling, lost create answers), in a background thread.
- :class:`AnthropicBatchStub`: Anthropic Message Batches (``/v1/messages/batches``) that end
  batches for real and misbehave on demand (errored and expired items, 429 / 5xx on create and
  polling, lost creates, batches stuck until cancelled), results in shuffled order.
- :class:`GeminiBatchStub`: the Gemini Batch API (inline or uploaded-file batches, the
  ``google-genai`` SDK's wire) with out-of-order results, refused and retryable items, partial
  expiry, stuck batches and 429 / 5xx on create and polling.
- :class:`CountingProxy`: forwards to a real server and counts what it forwards, to tell what
  was sent twice.
- :class:`PostgresServer`: a real PostgreSQL server on loopback (the distribution's programs),
  for ``database=`` / ``--database``.
- :class:`AppServer`: an ASGI application (``batchclient.server.create_app(...)``) on a real
  uvicorn server on loopback, in a background thread.
"""

from ._anthropic_stub import AnthropicBatchStub
from ._app_server import AppServer
from ._batch_stub import BatchAPIStub
from ._gemini_stub import GeminiBatchStub
from ._postgres import PostgresServer
from ._process import StubProcess
from ._proxy import CountingProxy
from ._stub import Fault, StubReply, StubServer, StubStats
from ._vllm_server import free_port, vllm_server

__all__ = [
    "AnthropicBatchStub",
    "AppServer",
    "BatchAPIStub",
    "CountingProxy",
    "Fault",
    "GeminiBatchStub",
    "PostgresServer",
    "StubProcess",
    "StubReply",
    "StubServer",
    "StubStats",
    "free_port",
    "vllm_server",
]
