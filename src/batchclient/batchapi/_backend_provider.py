"""``BackendProvider``: a :class:`RemoteBatchBackend` as a :class:`~batchclient.Provider`.

The provider batch clients use it for identity, start / stop and the endpoints served; they run
whole calls and jobs as remote batches themselves (:class:`~._backend_runner.BackendRunner`).
:meth:`BackendProvider.execute` runs one request as a one-request remote batch (not durable),
for code that only knows the ``Provider`` interface: correct, but each request waits for its
own batch.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import anyio
import orjson

from .._core.provider import Provider
from .._core.request import Request, Result, failed
from ..errors import ConfigurationError, ErrorCode
from ..jobs import RequestLine
from ..types import Endpoint
from ._backend import RemoteBatchBackend
from ._parts import line_result
from ._retry import ApiError


class BackendProvider(Provider):
    """``backend`` as a provider serving ``endpoints``."""

    def __init__(
        self,
        backend: RemoteBatchBackend,
        endpoints: frozenset[Endpoint] = frozenset({Endpoint.chat_completions}),
    ) -> None:
        self.backend = backend
        self.endpoints = endpoints

    async def start(self) -> None:
        await self.backend.start()

    async def stop(self) -> None:
        await self.backend.stop()

    def identity(self) -> dict[str, Any]:
        return self.backend.identity()

    async def check_model(self, model: str) -> None:
        # these batch APIs are not asked for their models (one more call per batch, and a
        # key may be scoped to some), but an empty name is wrong on every one of them
        if not isinstance(model, str) or not model.strip():
            raise ConfigurationError(f"model must be a non-empty name, not {model!r}")

    async def execute(self, request: Request) -> Result:
        line = RequestLine(seq=0, line=1, custom_id="0", body=request.body)
        data = self.backend.encode(line, request.endpoint.value)
        if isinstance(data, Result):
            return data
        fd, name = tempfile.mkstemp(prefix="batchclient-", suffix=".jsonl")
        path = Path(name)
        retrier = self.backend.retrier
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            remote_id = await self.backend.submit(path, 1, {})
            while True:
                state = await retrier.call(lambda: self.backend.poll(remote_id), forever=True)
                if state.ended:
                    break
                await anyio.sleep(self.backend.poll_interval_s)
            await retrier.call(lambda: self.backend.results(remote_id, path))
            for raw in (await anyio.Path(path).read_bytes()).splitlines():
                result = line_result(orjson.loads(raw))
                if result is not None:
                    return result
            return failed(ErrorCode.batch_expired, f"the remote batch {remote_id} did not run it")
        except ApiError as exc:
            code = ErrorCode.endpoint_unavailable if exc.status is None else ErrorCode.server_error
            return failed(code, str(exc), status_code=exc.status)
        finally:
            await anyio.Path(path).unlink(missing_ok=True)
