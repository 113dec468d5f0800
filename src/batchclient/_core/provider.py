"""``Provider``: the one interface every way of running requests implements.

A provider turns one :class:`Request` into one :class:`Result`. ``BatchClient`` (the protocol's
calls), the jobs and the benchmark use nothing else, so any provider gets ordered
``batch_chat_completion`` results, per-item errors, progress and durable, resumable jobs.
``docs/design.md`` ("The Provider interface") shows a complete third-party provider.
:class:`DelegatingProvider` is the base of providers that wrap another one.
"""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Any, Self

from ..errors import ConfigurationError
from ..types import Endpoint
from .ledger import Billing
from .request import Request, Result
from .tokens import Tokenizer

__all__ = ["DelegatingProvider", "Provider"]


class Provider(abc.ABC):
    """Runs requests. Subclass it and implement :meth:`execute`; the rest have defaults.

    Lifecycle: :meth:`start` is awaited once before the first request and :meth:`stop` once
    after the last (``BatchClient``'s ``async with`` does both; a provider is also an async
    context manager itself). ``execute`` may be called up to :meth:`max_in_flight` times
    concurrently.
    """

    endpoints: frozenset[Endpoint] = frozenset({Endpoint.chat_completions})
    """The endpoints whose requests :meth:`execute` can run (a batch file for another one is
    refused at validation; a call for another one raises ``ConfigurationError``). A class
    attribute; a provider whose endpoints depend on its configuration sets it per instance."""

    async def start(self) -> None:  # noqa: B027 (optional hook: most providers need one)
        """Acquire what requests need (connections, an engine). Raise ``EndpointError`` or
        ``ConfigurationError`` when that is impossible."""

    async def stop(self) -> None:  # noqa: B027
        """Release everything :meth:`start` acquired. Must not raise; called even after a
        failed start."""

    @abc.abstractmethod
    async def execute(self, request: Request) -> Result:
        """Run one request and return its result.

        Every failure of this one request (a refusal, an HTTP error, a timeout, an engine error)
        is returned as a failed :class:`Result` (``batchclient.failed(code, message)``), never
        raised: an exception that escapes anyway becomes that item's ``internal_error`` and the
        rest of the batch finishes. Cancellation must stop the request (close its connection,
        abort it in the engine) before re-raising.
        """

    def max_in_flight(self) -> int:
        """How many requests may be in :meth:`execute` at once (the scheduler runs that many
        workers; the provider may hold some of them back inside ``execute``)."""
        return 64

    async def check_model(self, model: str) -> None:  # noqa: B027
        """Raise ``ModelNotFoundError`` when ``model`` is known not to be served (checked once
        per call and per job, before any request is sent). Default: no check."""

    async def models(self) -> list[str]:
        """The names of the models this provider serves (``GET /v1/models`` of
        ``batchclient serve``); empty when it cannot tell. Default: empty."""
        return []

    async def tokenizer(self, model: str) -> Tokenizer:
        """The tokenizer of ``model``, for the scoring calls (``batch_loglikelihood`` with text,
        ``batch_loglikelihood_rolling``). Default: raises ``ConfigurationError`` (this provider
        cannot tokenise; give token ids instead)."""
        raise ConfigurationError(
            f"{type(self).__name__} has no tokenizer for {model!r}: give the scoring requests "
            "as token ids"
        )

    def identity(self) -> dict[str, Any]:
        """What changes the answers (JSON-serialisable, never a secret): a job interrupted on
        this provider is resumed only by a provider with the same identity. Default: the class
        name."""
        return {"provider": type(self).__name__}

    async def cache_identity(self, model: str) -> dict[str, Any]:
        """What, besides the request, decides the answers of ``model`` here (JSON-serialisable,
        never a secret): part of the result cache's key, so an answer is reused only by a
        provider with the same identity. Default: :meth:`identity` plus the model name.
        Providers that can tell which weights serve a name (remote: ``/v1/models``; inline:
        the model path and engine arguments) say so, so swapped weights miss the cache."""
        return {**self.identity(), "model": model}

    async def tokenizer_path(self, model: str) -> str | None:
        """A local directory with the tokenizer of ``model`` (for counting prompt tokens in a
        dry run), or None when there is none here. Default: None."""
        return None

    def concurrency_limit(self) -> int | None:
        """The current number of requests allowed in flight, for progress reports (None:
        unknown)."""
        return None

    def billing(self, model: str) -> Billing:
        """How ``model``'s requests are billed here, for dry runs and cost reports
        (:class:`~batchclient._core.ledger.Billing`). Default: the ``standard`` tier without a
        prompt-cache rule."""
        return Billing()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


class DelegatingProvider(Provider):
    """A provider that hands every member of the interface to ``inner``; a wrapper subclasses
    it and overrides only what it changes (``SharedProvider``: ``start`` and ``stop``;
    ``CachedProvider``: ``execute``). A wrapper that forwarded member by member would quietly
    answer with :class:`Provider`'s defaults for every hook it forgot, or that was added later
    (a cache key without the weights, a missing tokenizer).

    ``endpoints`` is read from ``inner`` each time: a provider may learn its endpoints only
    when it starts (the inline engine finds out then whether it embeds).
    """

    def __init__(self, inner: Provider) -> None:
        self.inner = inner

    @property
    def endpoints(self) -> frozenset[Endpoint]:  # type: ignore[override]  # read-only here
        return self.inner.endpoints

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    async def execute(self, request: Request) -> Result:
        return await self.inner.execute(request)

    def max_in_flight(self) -> int:
        return self.inner.max_in_flight()

    async def check_model(self, model: str) -> None:
        await self.inner.check_model(model)

    async def models(self) -> list[str]:
        return await self.inner.models()

    async def tokenizer(self, model: str) -> Tokenizer:
        return await self.inner.tokenizer(model)

    def identity(self) -> dict[str, Any]:
        return self.inner.identity()

    async def cache_identity(self, model: str) -> dict[str, Any]:
        return await self.inner.cache_identity(model)

    async def tokenizer_path(self, model: str) -> str | None:
        return await self.inner.tokenizer_path(model)

    def concurrency_limit(self) -> int | None:
        return self.inner.concurrency_limit()

    def billing(self, model: str) -> Billing:
        return self.inner.billing(model)
