"""``CachedProvider``: a provider that answers from the result cache before asking another.

It wraps the provider that really runs requests (every member of the interface but ``execute``
is that provider's), so calls and jobs get the cache through the one interface they already use.
Only successful answers are stored: status 2xx, no error, and for chat completions the same
verdict ``batch_chat_completion`` gives (an answer that failed a schema or tool-call check is
not a success). A hit is returned with ``extra["cached"] = True``, which the decoders report as
the item's ``cached`` metric.
"""

from __future__ import annotations

import anyio

from .._core.decode import to_response
from .._core.provider import DelegatingProvider, Provider
from .._core.request import Request, Result
from ..types import Endpoint
from ._key import cache_key, canonical_json, request_digest
from ._store import ResultCache

__all__ = ["CachedProvider", "is_cacheable"]


def is_cacheable(request: Request, result: Result) -> bool:
    """Whether ``result`` is a successful answer worth keeping."""
    if result.error is not None or result.status_code is None:
        return False
    if not 200 <= result.status_code < 300 or not isinstance(result.body, dict):
        return False
    if request.endpoint == Endpoint.chat_completions:
        return to_response(request, result).error is None
    return True


class CachedProvider(DelegatingProvider):
    """``inner`` behind the result cache ``cache``: only :meth:`execute` differs, every other
    member goes to ``inner`` (the client starts and stops ``inner`` itself and never this
    wrapper, which owns nothing).

    The key of a request is :func:`~batchclient.cache.cache_key` of its endpoint and body (and
    tool prompt format), ``inner.cache_identity(model)`` (asked once per model for the life of
    this wrapper) and ``request.repeat``.
    """

    def __init__(self, inner: Provider, cache: ResultCache) -> None:
        super().__init__(inner)
        self.cache = cache
        self._identities: dict[str, bytes] = {}
        self._identity_lock = anyio.Lock()

    async def identity_bytes(self, model: str) -> bytes:
        """The canonical cache identity of ``model`` on the inner provider (memoised)."""
        known = self._identities.get(model)
        if known is not None:
            return known
        async with self._identity_lock:
            known = self._identities.get(model)
            if known is None:
                known = canonical_json(await self.inner.cache_identity(model))
                self._identities[model] = known
        return known

    async def key(self, request: Request) -> str:
        """The cache key of ``request``."""
        identity = await self.identity_bytes(str(request.body.get("model")))
        fmt = None if request.tool_prompt_format is None else str(request.tool_prompt_format)
        digest = request_digest(request.endpoint, request.body, fmt)
        return cache_key(digest, identity, request.repeat)

    async def execute(self, request: Request) -> Result:
        key = await self.key(request)
        hit = self.cache.get(key)
        if hit is not None:
            return Result(status_code=hit.status_code, body=hit.body, extra={"cached": True})
        result = await self.inner.execute(request)
        if is_cacheable(request, result):
            assert result.status_code is not None and result.body is not None
            self.cache.put(
                key,
                endpoint=str(request.endpoint),
                model=str(request.body.get("model")),
                status_code=result.status_code,
                body=result.body,
            )
        return result
