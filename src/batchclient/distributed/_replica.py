"""One engine replica: the inline provider (:class:`~batchclient.inline.VLLMProvider`) inside a Ray
actor.

The driver makes the actor with ``ray.remote(EngineReplica).options(...)`` and calls
:meth:`EngineReplica.start` (idempotent: a restarted actor is a fresh instance, so the driver
calls it again to build the new engine). Requests cross as the internal ``Request`` / ``Result``
pair, so the replica runs exactly the inline provider's request path for every endpoint its
engine serves (chat, completions and scoring, or embeddings on a pooling engine; rendering,
sampling rules, per-item errors, aborts on cancellation: Ray cancels the asyncio task of a
cancelled call, and the provider aborts the engine request). The scoring calls' tokenizer is the
engine's own, asked through :meth:`EngineReplica.tokenizer_info` and
:meth:`EngineReplica.encode`. Imported inside Ray worker processes, not by ``import
batchclient``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._core.request import Request, Result, failed
from .._core.tokens import TokenizerInfo
from .._engine_defaults import choose_cores
from ..errors import ConfigurationError, ErrorCode
from ..inline import VLLMProvider
from ..models import resolve_model
from ..types import BatchItemError
from . import _cores


@dataclass
class ReplicaInfo:
    """What a started replica reports: where it runs, its names, the endpoints its engine
    serves (``Endpoint`` values), binding and leftovers record."""

    node_id: str
    served: str
    names: list[str]
    endpoints: list[str]
    binding: str | None
    record: dict[str, Any]


class EngineReplica:
    """A Ray actor class holding one engine (see the module docstring).

    Args:
        model, max_concurrency, tool_call_parser: as ``VLLMProvider``.
        engine_args: the other keyword arguments of ``VLLMProvider`` (its
            ``single_token_scoring`` and vLLM's engine arguments).
        cores_per_replica: on CPU, how many of the node's cores this replica binds (it claims
            the first free group of that many; see :mod:`._cores`). None: no binding of our
            own (GPU, or ``VLLM_CPU_OMP_THREADS_BIND`` set by the caller).
    """

    def __init__(
        self,
        model: str | None,
        max_concurrency: int,
        tool_call_parser: str | None,
        cores_per_replica: int | None,
        engine_args: dict[str, Any],
    ) -> None:
        self._kwargs: dict[str, Any] = {
            "max_concurrency": max_concurrency,
            "tool_call_parser": tool_call_parser,
            **engine_args,
        }
        self._model = model
        self._cores_per_replica = cores_per_replica
        self._provider: VLLMProvider | None = None
        self._slot: _cores.Slot | None = None
        self._info: ReplicaInfo | None = None
        self._starting = asyncio.Lock()

    async def start(self) -> ReplicaInfo:
        """Build the engine (once per actor incarnation, whoever asks) and report where it
        runs."""
        async with self._starting:
            if self._info is None:
                self._info = await self._start()
            return self._info

    async def _start(self) -> ReplicaInfo:
        import ray

        cores = None
        # batchclient binds (the rule of every engine: CPU, variable unset): a share of cores
        if self._cores_per_replica and choose_cores(cpu=_is_cpu()).value is not None:
            self._slot = _cores.claim(self._cores_per_replica)
            cores = self._slot.cores
        provider = VLLMProvider(self._model, cpu_cores=cores, **self._kwargs)
        await provider.start()
        self._provider = provider
        record = _cores.SlotRecord(slot=None, cores=[])
        if self._slot is not None:
            record = _cores.engine_record(self._slot)
            self._slot.write(record)
        served = self._kwargs.get("served_model_name") or resolve_model(self._model)[0]
        return ReplicaInfo(
            node_id=ray.get_runtime_context().get_node_id(),
            served=str(served if isinstance(served, str) else served[0]),
            names=sorted(provider.served_names()),
            endpoints=sorted(e.value for e in provider.endpoints),
            binding=provider.binding,
            record=record.to_json(),
        )

    async def execute(self, request: Request) -> Result:
        provider = self._provider
        if provider is None:
            return failed(ErrorCode.engine_error, "the replica's engine is not running")
        return await provider.execute(request)

    async def tokenizer_info(self, model: str) -> TokenizerInfo:
        """The engine's tokenizer's facts (``ModelNotFoundError`` for a model it does not
        serve, ``ConfigurationError`` while its engine is not running)."""
        return await (await self._running().tokenizer(model)).info()

    async def encode(
        self, model: str, texts: Sequence[str], add_special_tokens: bool
    ) -> list[list[int] | BatchItemError]:
        """Token ids of each text by the engine's own tokenizer (as ``Tokenizer.encode``)."""
        tokenizer = await self._running().tokenizer(model)
        return await tokenizer.encode(texts, add_special_tokens=add_special_tokens)

    def _running(self) -> VLLMProvider:
        if self._provider is None:
            raise ConfigurationError("the replica's engine is not running")
        return self._provider

    async def counts(self) -> tuple[int, int, int]:
        """The engine's (front-end unfinished, running, waiting) request counts."""
        return (0, 0, 0) if self._provider is None else self._provider.engine_counts()

    async def stop(self) -> None:
        """Shut the engine down cleanly (its processes exit, its shared memory is unlinked)."""
        provider, self._provider = self._provider, None
        self._info = None
        if provider is not None:
            await provider.stop()
        if self._slot is not None:
            self._slot.release()
            self._slot = None


def _is_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())
