"""``Provider``: the one interface every way of running requests implements.

A provider turns one :class:`Request` into one :class:`Result`. ``BatchClient`` (the protocol's
calls), the jobs and the benchmark use nothing else, so any provider gets ordered
``batch_chat_completion`` results, per-item errors, progress and durable, resumable jobs.
``docs/design.md`` ("The Provider interface") shows a complete third-party provider.
"""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Any, ClassVar, Self

from ..types import Endpoint
from .request import Request, Result

__all__ = ["Provider"]


class Provider(abc.ABC):
    """Runs requests. Subclass it and implement :meth:`execute`; the rest have defaults.

    Lifecycle: :meth:`start` is awaited once before the first request and :meth:`stop` once
    after the last (``BatchClient``'s ``async with`` does both; a provider is also an async
    context manager itself). ``execute`` may be called up to :meth:`window` times concurrently.
    """

    endpoints: ClassVar[frozenset[Endpoint]] = frozenset({Endpoint.chat_completions})
    """The endpoints whose requests :meth:`execute` can run (a batch file for another one is
    refused at validation)."""

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

    def window(self) -> int:
        """How many requests may be in :meth:`execute` at once (the scheduler's window)."""
        return 64

    async def check_model(self, model: str) -> None:  # noqa: B027
        """Raise ``ModelNotFoundError`` when ``model`` is known not to be served (checked once
        per call and per job, before any request is sent). Default: no check."""

    async def models(self) -> list[str]:
        """The names of the models this provider serves (``GET /v1/models`` of
        ``batchclient serve``); empty when it cannot tell. Default: empty."""
        return []

    def identity(self) -> dict[str, Any]:
        """What changes the answers (JSON-serialisable, never a secret): a job interrupted on
        this provider is resumed only by a provider with the same identity. Default: the class
        name."""
        return {"provider": type(self).__name__}

    def concurrency_limit(self) -> int | None:
        """The current number of requests allowed in flight, for progress reports (None:
        unknown)."""
        return None

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
