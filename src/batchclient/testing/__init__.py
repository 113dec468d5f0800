"""Real servers on loopback for tests, demos and benchmarks.

- :func:`vllm_server`, :func:`free_port`: the real vLLM OpenAI server in a child process group,
  started and torn down by a plain context manager.
- :class:`StubServer`, :class:`Fault`, :class:`StubReply`: an OpenAI-compatible stub server with
  latency, capacity, a quota announced in ``x-ratelimit-*`` headers, ``Retry-After``, 5xx
  bursts, connection resets and malformed bodies on demand, in a background thread;
  :class:`StubProcess` runs it as its own process (``python -m batchclient.testing stub
  --help``).
- :class:`BatchAPIStub`: an OpenAI Batch API (``/v1/files`` + ``/v1/batches``) that runs batches
  for real and misbehaves on demand (validation failures, expiry with partial output, 5xx / 429
  on polling, lost create answers), in a background thread.
- :class:`CountingProxy`: forwards to a real server and counts what it forwards, to tell what
  was sent twice.
- :class:`AppServer`: an ASGI application (``batchclient.server.create_app(...)``) on a real
  uvicorn server on loopback, in a background thread.
"""

from ._app_server import AppServer
from ._batch_stub import BatchAPIStub, BatchStubStats
from ._process import StubProcess
from ._proxy import CountingProxy
from ._stub import Fault, StubReply, StubServer, StubStats
from ._vllm_server import free_port, vllm_server

__all__ = [
    "AppServer",
    "BatchAPIStub",
    "BatchStubStats",
    "CountingProxy",
    "Fault",
    "StubProcess",
    "StubReply",
    "StubServer",
    "StubStats",
    "free_port",
    "vllm_server",
]
