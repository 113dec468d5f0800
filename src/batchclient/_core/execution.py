"""How a client runs its calls and its batches: ``BatchClient(provider, execution=...)``.

- ``Execution()``, the default, runs them **live**: a call's requests go through
  ``provider.execute`` as the scheduler pulls them (``run_requests``), and a batch of
  ``client.batches`` through the jobs' own runner over ``provider.execute``.
- ``batchclient.batchapi.RemoteBatchExecution`` runs them as **remote batches**: each call is a
  durable local job whose requests a provider's Batch API runs (OpenAI and the APIs shaped like
  it, Anthropic Message Batches, Gemini), as is each batch of ``client.batches``.

The client asks its execution three things: how a call runs (:meth:`Execution.run`), how a
batch runs (:meth:`Execution.job_runner`) and what ``client.batches`` is
(:meth:`Execution.batches`). Guide: ``docs/design.md`` ("The Provider interface").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..jobs import Batches, JobManager
from ..jobs._runner import JobRunner
from ..types import ProgressCallback
from .request import Request, Result

__all__ = ["Call", "Execution", "LiveRun"]

R = TypeVar("R")


@dataclass(frozen=True)
class Call(Generic[R]):
    """One call as the client hands it to its execution: ``n`` requests (indexes ``0..n-1``,
    built lazily as they are pulled); ``decode`` turns a request's result into its item, or into
    a staged tuple that ``build`` turns into the item; ``progress`` and ``on_item`` as the call
    was given them; ``cache``: whether the result cache answers first."""

    requests: Iterable[Request]
    n: int
    decode: Callable[[Request, Result], Any]
    progress: ProgressCallback | None = None
    on_item: Callable[[int, R], None] | None = None
    cache: bool = False
    build: Callable[[Any], R] | None = None


LiveRun = Callable[[Call[Any]], Awaitable[list[Any]]]
"""The client's live run of a call (through ``provider.execute``): the items, in input order."""


class Execution:
    """How a client runs its calls and batches. This class is the default, live execution;
    a subclass overrides what it runs otherwise."""

    async def run(self, call: Call[R], jobs: Callable[[], JobManager], live: LiveRun) -> list[R]:
        """Run ``call``; its items in input order. ``jobs``: the open client's job manager (it
        raises ``ClientClosedError`` when the client is not open); ``live``: the client's live
        run, which this default hands the call to."""
        return await live(call)

    def job_runner(self) -> JobRunner | None:
        """How each batch runs (``client.batches``, ``schedule_batch``); None: the jobs' own
        runner over ``provider.execute``."""
        return None

    def batches(self, jobs: Callable[[], JobManager]) -> Batches:
        """The client's ``batches`` over its job manager ``jobs``."""
        return Batches(jobs)
