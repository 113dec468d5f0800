"""``RayProvider``: N engine replicas as Ray actors behind the shared replica router, and
``RayBatchInference``, the client over it.

Each replica is one Ray actor holding one inline engine (:mod:`._replica`). Requests are
dispatched by the replica router the remote provider uses (``batchclient._routing``): each
takes a slot on the least-loaded replica (in flight relative to its limit, ``max_concurrency``
per replica). A replica whose actor dies is ejected at once and every request it had in flight
is sent again to the others (Ray raises ``RayActorError`` in each caller within milliseconds);
when Ray restarts the actor (``max_restarts``), a background task builds its new engine and takes
it back. The replicas serve what their engine serves (chat, completions and scoring; embeddings
on a pooling engine), and the scoring calls tokenise with the engines' own tokenizer
(:mod:`._tokenizer`). Guide: ``docs/scale-out.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from .._core.client import BatchClient
from .._core.ledger import Billing
from .._core.prefix import prefix_key
from .._core.provider import Provider
from .._core.request import Request, Result, failed
from .._core.tokens import Tokenizer
from .._cpu import affinity
from .._options import document, split
from .._routing.adaptive import AdaptiveSettings
from .._routing.dispatch import Dispatcher, Replica, ReplicasUnavailable
from .._routing.rates import RateBuckets
from ..errors import (
    BatchClientError,
    ConfigurationError,
    EndpointError,
    ErrorCode,
    ModelNotFoundError,
)
from ..models import BUNDLED_MODEL_NAME
from ..types import Endpoint
from . import _cores
from ._options import RayOptions
from ._tokenizer import ReplicaTokenizer

__all__ = ["RayBatchInference", "RayProvider"]

_INSTALL_HINT = "the Ray provider needs Ray: pip install 'batchclient[ray]'"
_LANE = "engine"  # one lane per replica: every replica serves the same model
_EJECTED_S = 24 * 3600.0  # a dead replica stays out until it is known to be back
_STOP_TIMEOUT_S = 60.0
_GENERATE = frozenset({Endpoint.chat_completions, Endpoint.completions})
_POOLING = frozenset({Endpoint.embeddings})


class ReplicaHandle:
    """The driver's side of one replica: its actor and what it reported on start."""

    def __init__(self, index: int, actor: Any) -> None:
        self.index = index
        self.actor = actor
        self.info: Any = None  # ReplicaInfo
        self.deaths = 0
        self.dead = False  # for good: no restart left

    def close(self) -> None:  # the Dispatcher closes its replicas' pools; the actors end in stop
        pass


@dataclass
class AttachedReplicas:
    """A picklable recipe for a :class:`RayProvider` over replicas that another provider
    started (e.g. in a Ray Data actor): calling it returns that provider. It dispatches and
    re-sends like its origin and takes restarted replicas back, but never starts or stops
    them."""

    actors: list[Any]
    infos: list[Any]
    max_concurrency: int
    max_restarts: int
    restart_wait_s: float

    def __call__(self) -> RayProvider:
        provider = RayProvider(
            replicas=len(self.actors),
            max_concurrency=self.max_concurrency,
            max_restarts=self.max_restarts,
            restart_wait_s=self.restart_wait_s,
        )
        provider._attached = self
        return provider


class RayProvider(Provider):
    """Inline engines on Ray as a :class:`~batchclient.Provider`. Arguments as
    :class:`RayBatchInference`, without ``state_dir`` and ``cache``; the resolved options are
    ``options``, the engine arguments ``engine_args``."""

    def __init__(self, model: str | None = None, **options: Any) -> None:
        self.options, engine_args = split(RayOptions, options, who="the ray provider")
        o = self.options
        if o["replicas"] < 1:
            raise ConfigurationError("replicas must be >= 1")
        if o["max_concurrency"] < 1:
            raise ConfigurationError("max_concurrency must be >= 1")
        if o["max_restarts"] < -1:
            raise ConfigurationError("max_restarts must be >= -1 (-1: without limit)")
        if o["cores_per_replica"] is not None and o["cores_per_replica"] < 1:
            raise ConfigurationError("cores_per_replica must be >= 1")
        self.model = model
        self.replicas = o["replicas"]
        self.address = o["address"]
        self.resources_per_replica = dict(o["resources_per_replica"] or {})
        self.max_concurrency = o["max_concurrency"]
        self.max_restarts = o["max_restarts"]
        self.cores_per_replica = o["cores_per_replica"]
        self.restart_wait_s = o["restart_wait_s"]
        self.tool_call_parser = o["tool_call_parser"]
        self.single_token_scoring = o["single_token_scoring"]
        self.prefix_affinity = o["prefix_affinity"]
        self.runtime_env = dict(o["runtime_env"] or {})
        self.engine_args = dict(engine_args)
        # as the inline provider: what the engine arguments say until the replicas report
        self.endpoints = _POOLING if engine_args.get("runner") == "pooling" else _GENERATE
        self.handles: list[ReplicaHandle] = []
        self._dispatcher: Dispatcher | None = None
        self._owns_ray = False
        self._names: frozenset[str] = frozenset()
        self._node_id = ""
        self._back = asyncio.Event()  # set when a replica is taken back
        self._watchers: set[asyncio.Task[None]] = set()
        self._attached: AttachedReplicas | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ConfigurationError(f"{_INSTALL_HINT} ({exc})") from exc
        await anyio.to_thread.run_sync(self._connect, ray)
        if self._attached is not None:
            self._node_id = ray.get_runtime_context().get_node_id()
            self.handles = [ReplicaHandle(i, a) for i, a in enumerate(self._attached.actors)]
            for handle, info in zip(self.handles, self._attached.infos, strict=True):
                handle.info = info
            self._took(self._attached.infos[0])
            self._dispatcher = self._build_dispatcher()
            return
        try:
            self._node_id = ray.get_runtime_context().get_node_id()
            options = self._actor_options(ray)
            from ._replica import EngineReplica

            cls = ray.remote(EngineReplica)
            cores = self._cores_per_replica(ray, options)
            prefix = f"batchclient-replica-{uuid.uuid4().hex[:8]}"
            self.handles = [
                ReplicaHandle(
                    i,
                    cls.options(**options, name=f"{prefix}-{i}").remote(
                        self.model,
                        self.max_concurrency,
                        self.tool_call_parser,
                        cores,
                        {"single_token_scoring": self.single_token_scoring, **self.engine_args},
                    ),
                )
                for i in range(self.replicas)
            ]
            infos = await asyncio.gather(
                *(h.actor.start.remote() for h in self.handles), return_exceptions=True
            )
            problems = [i for i in infos if isinstance(i, BaseException)]
            if problems:
                raise _start_error(problems[0])
            for handle, info in zip(self.handles, infos, strict=True):
                handle.info = info
            self._took(infos[0])
            self._dispatcher = self._build_dispatcher()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.stop()
            raise

    def _took(self, info: Any) -> None:
        """What every replica serves (they run one configuration): the model's names and the
        endpoints of its engine (a model may make it a pooling one by itself)."""
        self._names = frozenset(info.names)
        self.endpoints = frozenset(Endpoint(e) for e in info.endpoints)

    def _connect(self, ray: Any) -> None:
        """Join the Ray this process already uses, the cluster at ``address``, or start a local
        one for this provider (without the dashboard: about 200 MiB less)."""
        if ray.is_initialized():
            return
        if self.address is None and not os.environ.get("RAY_ADDRESS"):
            ray.init(include_dashboard=False, logging_level="WARNING")
        else:
            ray.init(address=self.address, logging_level="WARNING")
        self._owns_ray = True

    def _actor_options(self, ray: Any) -> dict[str, Any]:
        resources = dict(self.resources_per_replica)
        if "num_gpus" not in resources and ray.cluster_resources().get("GPU", 0) > 0:
            # tensor x pipeline parallel ranks of one engine, all inside this actor
            resources["num_gpus"] = int(self.engine_args.get("tensor_parallel_size") or 1) * int(
                self.engine_args.get("pipeline_parallel_size") or 1
            )
        resources.setdefault("num_cpus", 1)
        known = {"num_cpus", "num_gpus", "memory", "accelerator_type", "resources"}
        custom = {k: v for k, v in resources.items() if k not in known}
        options = {k: v for k, v in resources.items() if k in known}
        if custom:
            options["resources"] = {**options.get("resources", {}), **custom}
        options.update(
            max_restarts=self.max_restarts,
            max_task_retries=0,  # we re-send ourselves, to another replica
            max_concurrency=self.max_concurrency + 16,  # the engine's requests and a few probes
        )
        if self.runtime_env:
            options["runtime_env"] = self.runtime_env
        return options

    def _cores_per_replica(self, ray: Any, options: Mapping[str, Any]) -> int | None:
        """How many cores each replica binds on CPU: the given value; on a one-node Ray, this
        machine's cores divided among the replicas; on a cluster, the replica's ``num_cpus``.
        None on GPUs (vLLM binds nothing there)."""
        if options.get("num_gpus"):
            return None
        if self.cores_per_replica is not None:
            return self.cores_per_replica
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if len(alive) <= 1:
            return max(1, len(affinity()) // self.replicas)
        return max(1, int(options.get("num_cpus") or 1))

    def _build_dispatcher(self) -> Dispatcher:
        settings = AdaptiveSettings(
            initial=self.max_concurrency, minimum=1, maximum=self.max_concurrency
        )
        replicas = [
            Replica(f"ray-replica-{h.index}", h, RateBuckets(None, None), settings, False)
            for h in self.handles
        ]
        return Dispatcher(replicas, eject_after=1, eject_s=_EJECTED_S)

    @property
    def attached(self) -> AttachedReplicas:
        """A picklable recipe for a provider over these running replicas (see
        :class:`AttachedReplicas`); for Ray Data actors and other processes of the job."""
        if not self.handles:
            raise ConfigurationError("the replicas are not running: use it inside `async with`")
        return AttachedReplicas(
            actors=[h.actor for h in self.handles],
            infos=[h.info for h in self.handles],
            max_concurrency=self.max_concurrency,
            max_restarts=self.max_restarts,
            restart_wait_s=self.restart_wait_s,
        )

    def served_name(self) -> str:
        """The model name the replicas serve (``smollm2`` for the bundled model)."""
        info = next((h.info for h in self.handles if h.info is not None), None)
        if info is None:
            raise ConfigurationError("the replicas are not running: use it inside `async with`")
        return str(info.served)

    async def stop(self) -> None:
        for task in list(self._watchers):
            task.cancel()
        self._watchers.clear()
        handles, self.handles = self.handles, []
        self._dispatcher = None
        if self._attached is not None:
            return  # their owner stops them
        if not handles and not self._owns_ray:
            return
        import ray

        async def stop_one(handle: ReplicaHandle) -> None:
            with contextlib.suppress(Exception):
                with anyio.fail_after(_STOP_TIMEOUT_S):
                    await handle.actor.stop.remote()
            with contextlib.suppress(Exception):
                ray.kill(handle.actor, no_restart=True)
            self._reap(handle)

        with anyio.CancelScope(shield=True):
            await asyncio.gather(*(stop_one(h) for h in handles))
            if self._owns_ray:
                self._owns_ray = False
                await anyio.to_thread.run_sync(ray.shutdown)

    def max_in_flight(self) -> int:
        return self.max_concurrency * self.replicas

    def billing(self, model: str) -> Billing:
        """``local``: the engine runs here, its prefix cache at no price."""
        return Billing("local")

    def concurrency_limit(self) -> int | None:
        return None if self._dispatcher is None else self._dispatcher.concurrency_limit()

    def identity(self) -> dict[str, Any]:
        # the replicas' dtype as this node's hardware chooses it (each replica chooses by its own)
        model = str(self.model or BUNDLED_MODEL_NAME)
        identity = {"provider": "ray", "model": model, "dtype": self._inline().dtype}
        if self.endpoints == _POOLING:  # as the inline provider's: embeddings differ
            identity["runner"] = "pooling"
        return identity

    def _inline(self) -> Any:
        """The inline provider each replica builds (not started): its cache identity and model
        path are the replicas' too."""
        from ..inline import VLLMProvider

        return VLLMProvider(self.model, tool_call_parser=self.tool_call_parser, **self.engine_args)

    async def cache_identity(self, model: str) -> dict[str, Any]:
        """As the inline provider's (model path, the engine arguments that change answers, the
        tool-call parser): replicas answer as one inline engine would."""
        identity: dict[str, Any] = await self._inline().cache_identity(model)
        return {**identity, "provider": "ray"}

    async def tokenizer_path(self, model: str) -> str | None:
        path: str | None = await self._inline().tokenizer_path(model)
        return path

    async def check_model(self, model: str) -> None:
        if model not in self._names:
            raise ModelNotFoundError(model, sorted(self._names))

    async def tokenizer(self, model: str) -> Tokenizer:
        """The engines' own tokenizer, asked of a live replica for each call (the driver loads
        nothing). Raises ``ConfigurationError`` before start, ``ModelNotFoundError`` for a
        model the replicas do not serve."""
        if not self.handles:
            raise ConfigurationError("the replicas are not running: use the client in `async with`")
        await self.check_model(model)
        return ReplicaTokenizer(model, self._live_actors)

    def _live_actors(self) -> list[Any]:
        """The replicas' actors, those in service first (an ejected one may be restarting)."""
        now = time.monotonic()
        dispatcher = self._dispatcher
        replicas = [] if dispatcher is None else dispatcher.replicas
        ready = [_handle(r) for r in replicas if r.ejected_until <= now]
        return [h.actor for h in ready] + [h.actor for h in self.handles if h not in ready]

    # ------------------------------------------------------------------ one request

    async def execute(self, request: Request) -> Result:
        dispatcher = self._dispatcher
        if dispatcher is None:
            return failed(ErrorCode.engine_error, "the replicas are not running")
        avoid: Replica | None = None
        # the shared prefix's key: requests that share one go to the replica whose prefix
        # cache holds it, while it has room (``_routing/dispatch.py``)
        key = prefix_key(request) if self.prefix_affinity and len(dispatcher.replicas) > 1 else None
        while True:
            lane = dispatcher.try_acquire(_LANE, avoid, key=key)
            if lane is None:
                try:
                    lane = await dispatcher.acquire(_LANE, avoid, key=key)
                except ReplicasUnavailable as exc:
                    if not await self._wait_for_a_replica():
                        return failed(ErrorCode.endpoint_unavailable, str(exc))
                    continue
            replica = lane.replica
            handle = _handle(replica)
            lane.sent += 1
            sent_at = time.monotonic()
            try:
                result = await self._call(handle, request)
            except _ReplicaDown as down:
                dispatcher.release(lane)
                self._replica_down(replica, str(down))
                avoid = replica
                continue  # sent again, to another replica
            except BaseException:
                dispatcher.release(lane)
                raise
            dispatcher.release(lane)
            dispatcher.on_success(lane, sent_at)
            return result

    async def _call(self, handle: ReplicaHandle, request: Request) -> Result:
        from ray.exceptions import RayActorError

        ref = handle.actor.execute.remote(request)
        try:
            result: Result = await ref
        except asyncio.CancelledError:
            import ray

            # Ray cancels the call's asyncio task in the actor; the inline provider there
            # aborts the engine request.
            with contextlib.suppress(Exception):
                ray.cancel(ref)
            raise
        except RayActorError as exc:
            raise _ReplicaDown(f"{type(exc).__name__}: {exc}") from None
        except Exception as exc:  # the replica's code raised: that item's engine error
            return failed(ErrorCode.engine_error, f"{type(exc).__name__}: {exc}")
        return result

    # ------------------------------------------------------------------ replicas dying

    def _replica_down(self, replica: Replica, why: str) -> None:
        """Eject a replica whose actor died (once per death), reap what it left on this node
        and, when Ray may restart it, watch for its return."""
        dispatcher = self._dispatcher
        if dispatcher is None or replica.ejected_until > time.monotonic():
            return
        replica.last_error = why
        dispatcher.eject(replica)
        handle = _handle(replica)
        handle.deaths += 1
        self._reap(handle)
        task = asyncio.get_running_loop().create_task(self._watch(replica, handle))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    def _reap(self, handle: ReplicaHandle) -> None:
        info = handle.info
        if info is None or info.node_id != self._node_id or not info.record.get("replica"):
            return  # another node's leftovers are reaped by the next replica in that slot
        record = _cores.SlotRecord.from_json(info.record)
        task = asyncio.get_running_loop().run_in_executor(None, _cores.reap, record)
        task.add_done_callback(lambda t: t.exception())  # a failed reap is not worth a crash

    async def _watch(self, replica: Replica, handle: ReplicaHandle) -> None:
        """Until the actor is back (Ray restarted it: build its engine, take it back) or dead
        for good (no restart left)."""
        from ray.exceptions import ActorDiedError, RayActorError

        restarts_left = self.max_restarts < 0 or handle.deaths <= self.max_restarts
        deadline = time.monotonic() + self.restart_wait_s
        while restarts_left and time.monotonic() < deadline:
            try:
                handle.info = await handle.actor.start.remote()
            except ActorDiedError:
                break  # dead for good: Ray will not restart it
            except RayActorError:
                await asyncio.sleep(1.0)  # restarting
                continue
            except Exception as exc:  # the new engine failed to start
                replica.last_error = f"restart failed: {type(exc).__name__}: {exc}"
                break
            if self._dispatcher is not None:
                self._dispatcher.readmit(replica)
                self._back.set()
            return
        handle.dead = True
        self._back.set()  # wake waiters: they may now fail for good

    async def _wait_for_a_replica(self) -> bool:
        """Every replica is out: wait while one may come back. False when none will."""
        while any(not h.dead for h in self.handles):
            self._back.clear()
            with anyio.move_on_after(self.restart_wait_s) as scope:
                await self._back.wait()
            if scope.cancelled_caught:
                return False
            if self._dispatcher is not None and any(
                replica.ejected_until <= time.monotonic() for replica in self._dispatcher.replicas
            ):
                return True
        return False

    # ------------------------------------------------------------------ inspection

    async def engine_counts(self) -> list[tuple[int, int, int]]:
        """Per live replica: (unfinished in its engine front end, running, waiting)."""
        out = []
        for handle in self.handles:
            with contextlib.suppress(Exception):
                out.append(tuple(await handle.actor.counts.remote()))
        return out  # type: ignore[return-value]


class _ReplicaDown(Exception):
    pass


def _handle(replica: Replica) -> ReplicaHandle:
    handle = replica.pool
    assert isinstance(handle, ReplicaHandle)
    return handle


def _start_error(exc: BaseException) -> BaseException:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BatchClientError):
        return cause
    if isinstance(exc, BatchClientError):
        return exc
    if not isinstance(exc, Exception):
        return exc
    return EndpointError(f"a Ray replica failed to start: {type(exc).__name__}: {exc}")


@document(RayOptions)
class RayBatchInference(BatchClient):
    """Batch inference on ``replicas`` vLLM engines, each in its own Ray actor. Use as
    ``async with``.

    The same protocol, per-item errors, jobs and CLI as the other clients. Each replica runs the
    inline provider's engine (``VLLMBatchInference``'s request path, defaults and errors), so the
    client serves what that engine serves: chat, ``batch_completion`` and the scoring calls
    (with the engines' own tokenizer), or ``batch_embeddings`` with ``runner="pooling",
    convert="embed"``. It dispatches each request to the least-loaded replica, ejects a replica
    whose actor dies and sends its unfinished requests to the others.

    Args (every one after ``model`` keyword-only; the options below are :class:`RayOptions`,
    the provider's; any other keyword is an engine argument):
        model: as ``VLLMBatchInference`` (None: the bundled SmolLM2-135M-Instruct). On a
            cluster, a path must exist on every node (or use a hub id).
        state_dir: where files, batches and results are kept (as the other clients).
        cache: use the result cache in ``state_dir`` for every call and batch (default False;
            see :class:`~batchclient.BatchClient`).
        database: a ``postgresql://`` URL keeping the state there instead of ``state_dir``
            (default ``$BATCHCLIENT_DATABASE_URL``; see :class:`~batchclient.BatchClient`).
        **engine_args: vLLM engine arguments for every replica, as ``VLLMBatchInference``
            (e.g. ``tensor_parallel_size=2`` shards each replica over 2 GPUs).

    Raises (on entering ``async with``):
        ConfigurationError: Ray or vLLM is not installed, or a bad argument (an option of the
            wrong type: at once).
        EndpointError: a replica failed to start (the message holds the reason).
    """

    provider: RayProvider

    def __init__(
        self,
        model: str | None = None,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        cache: bool = False,
        database: str | None = None,
        **options: Any,
    ) -> None:
        provider = RayProvider(model, **options)
        super().__init__(provider, state_dir=state_dir, cache=cache, database=database)
