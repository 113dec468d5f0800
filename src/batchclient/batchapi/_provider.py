"""``BatchAPIProvider``: a remote OpenAI Batch API (``/v1/files`` + ``/v1/batches``) as a
:class:`~batchclient.Provider`.

``BatchAPIBatchInference`` uses it for its connection, identity and model check, and runs whole
calls and jobs as remote batches itself. :meth:`BatchAPIProvider.execute` runs one request as a
one-line remote batch (not durable), for code that only knows the ``Provider`` interface; that is
correct but slow, since each request waits for its own batch.
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
from .._routing.settings import RetryPolicy
from ..errors import ConfigurationError, ErrorCode, ModelNotFoundError
from ..types import Endpoint
from ._api import BatchAPI
from ._flavors import check_window
from ._parts import batch_line, line_result
from ._retry import ApiError


class BatchAPIProvider(Provider):
    """A remote Batch API at ``base_url`` (the API root ending in ``/v1``). Arguments as
    :class:`~batchclient.BatchAPIBatchInference`."""

    endpoints: frozenset[Endpoint] = frozenset(Endpoint)

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        poll_interval: float = 10.0,
        completion_window: str = "24h",
        max_retries: int = 8,
        timeout: float = 600.0,
        retry: RetryPolicy = RetryPolicy(),
        headers: dict[str, str] | None = None,
        check_model: bool = True,
        flavor: str | None = None,
    ) -> None:
        if poll_interval <= 0:
            raise ConfigurationError("poll_interval must be > 0 seconds")
        if max_retries < 0 or timeout <= 0:
            raise ConfigurationError("max_retries must be >= 0 and timeout > 0 seconds")
        self.api = BatchAPI(
            base_url, api_key, headers=headers, timeout=timeout, max_retries=max_retries,
            retry=retry, flavor=flavor,
        )  # fmt: skip
        self.flavor = self.api.flavor.name
        check_window(self.api.flavor, completion_window, self.api.base_url)
        self.base_url = self.api.display  # without userinfo or secret query values
        self.poll_interval = poll_interval
        self.completion_window = completion_window
        self._check_models = check_model
        self._known: set[str] = set()

    async def start(self) -> None:
        await self.api.start()

    async def stop(self) -> None:
        await self.api.stop()

    def identity(self) -> dict[str, Any]:
        identity: dict[str, Any] = {"provider": "batch-api", "base_url": self.base_url}
        if self.flavor != "openai":  # the default stays out: earlier calls keep their keys
            identity["flavor"] = self.flavor
        return identity

    async def models(self) -> list[str]:
        listed = await self.api.models()
        return sorted(listed) if listed else []

    async def check_model(self, model: str) -> None:
        if not self._check_models or model in self._known:
            return
        listed = await self.api.models()
        if listed is not None and model not in listed:
            raise ModelNotFoundError(model, sorted(listed))
        self._known.add(model)

    async def execute(self, request: Request) -> Result:
        fd, name = tempfile.mkstemp(prefix="batchclient-", suffix=".jsonl")
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(batch_line("0", request.endpoint.value, request.body))
            return await self._one(path, request.endpoint.value)
        except ApiError as exc:
            code = ErrorCode.endpoint_unavailable if exc.status is None else ErrorCode.server_error
            return failed(code, str(exc), status_code=exc.status)
        finally:
            await anyio.Path(path).unlink(missing_ok=True)

    async def _one(self, path: Path, endpoint: str) -> Result:
        file_id = await self.api.upload(path, "request.jsonl")
        batch = await self.api.create(file_id, endpoint, self.completion_window, {})
        while not batch.terminal:
            await anyio.sleep(self.poll_interval)
            batch = await self.api.retrieve(batch.id, forever=True)
        for result_file in (batch.output_file_id, batch.error_file_id):
            if not result_file:
                continue
            await self.api.download(result_file, path)
            text = await anyio.Path(path).read_text()
            for line in text.splitlines():
                try:
                    result = line_result(orjson.loads(line))
                except orjson.JSONDecodeError:
                    return failed(ErrorCode.bad_upstream_response, "output line is not JSON")
                if result is not None:
                    return result
        code = ErrorCode.batch_expired if batch.status == "expired" else ErrorCode.batch_failed
        return failed(code, f"the remote batch {batch.id} ended {batch.status} without a result")
