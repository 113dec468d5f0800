"""The fair gate: how the server shares its provider's in-flight capacity.

Every tenant's requests reach the one provider through a :class:`FairGate` that admits at most
the provider's capacity (its current concurrency limit, else its ``max_in_flight()``) at once.
When a slot frees it goes to, in order:

1. the tenant holding the fewest slots among those with requests waiting, whatever kind they
   are (ties: the one served longest ago), so tenants share the capacity round-robin whatever
   the size of their batches and however many one-request calls they keep in flight;
2. within that tenant, a one-request call (``/v1/chat/completions`` and the other one-request
   routes) if any waits: someone is waiting on it, and it is one request;
3. otherwise its waiting batches of the highest ``metadata.priority`` (``high``, then
   ``normal``, then ``low``), the one holding the fewest slots first (ties: served longest
   ago).

So a 20-line batch started while another tenant's 20,000-line batch runs gets its share of the
next slots to free instead of queueing behind the large batch's requests; a tenant keeping 48
calls in flight gets its share, not every slot that frees, while another tenant's batch waits
(and a call of a tenant whose batch holds few slots is answered at the next slot to free); and
a tenant's ``high`` batch runs ahead of its ``low`` one. Requests answered from the result
cache never reach the gate. The flow of a request (its batch and priority, or a call) is read
from :func:`batchclient._core.flows.current_flow`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from .._core.flows import BATCH_PRIORITIES, Flow, Priority
from .._core.provider import Provider
from ._errors import APIError

_Key = tuple[Priority, str | None]  # (tier, batch) within a tenant


@dataclass(eq=False)
class _Tenant:
    held: int = 0
    served: int = 0  # grant counter when last served: lower is longer ago
    flows: dict[_Key, deque[asyncio.Future[None]]] = field(default_factory=dict)  # waiting
    flow_held: dict[_Key, int] = field(default_factory=dict)
    flow_served: dict[_Key, int] = field(default_factory=dict)


def provider_capacity(provider: Provider) -> int:
    """How many requests ``provider`` runs at once now: its current concurrency limit when it
    reports one (an adaptive remote provider's, which grows and shrinks), else its
    ``max_in_flight()``."""
    most = provider.max_in_flight()
    limit = provider.concurrency_limit()
    return max(1, min(most, limit) if limit is not None else most)


class FairGate:
    """Admits at most ``capacity()`` requests at once, granting freed slots as the module
    docstring says. ``capacity`` is read at each grant, so a limit that changes is followed."""

    def __init__(self, capacity: Callable[[], int]) -> None:
        self._capacity = capacity
        self.in_flight = 0
        self._tenants: dict[str, _Tenant] = {}
        self._counter = itertools.count(1)

    def capacity(self) -> int:
        """The slots there are now."""
        return self._capacity()

    def held(self, tenant: str) -> int:
        """The slots ``tenant`` holds now."""
        state = self._tenants.get(tenant)
        return state.held if state is not None else 0

    def waiting(self, tenant: str | None = None) -> int:
        """Requests waiting for a slot (of ``tenant``, or of everyone)."""
        states = self._tenants.values() if tenant is None else [self._tenants.get(tenant)]
        return sum(len(q) for s in states if s is not None for q in s.flows.values())

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str, flow: Flow) -> AsyncIterator[None]:
        """Hold one slot for the body of the ``async with``; waits for its turn."""
        key: _Key = (flow.priority, flow.batch)
        state = self._tenants.setdefault(tenant, _Tenant())
        if self.in_flight < self._capacity() and not self.waiting():
            self._take(state, key)
        else:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            queue = state.flows.setdefault(key, deque())
            queue.append(fut)
            try:
                await fut
            except BaseException:
                if fut.done() and not fut.cancelled():
                    self._give_back(tenant, key)  # granted as we were cancelled
                else:
                    with contextlib.suppress(ValueError):
                        queue.remove(fut)
                    if not queue and state.flows.get(key) is queue:
                        del state.flows[key]
                    self._forget(tenant)
                raise
        try:
            yield
        finally:
            self._give_back(tenant, key)

    def _take(self, state: _Tenant, key: _Key) -> None:
        self.in_flight += 1
        state.held += 1
        state.flow_held[key] = state.flow_held.get(key, 0) + 1
        state.served = state.flow_served[key] = next(self._counter)

    def _give_back(self, tenant: str, key: _Key) -> None:
        state = self._tenants[tenant]
        self.in_flight -= 1
        state.held -= 1
        state.flow_held[key] -= 1
        if not state.flow_held[key]:
            del state.flow_held[key]
            if key not in state.flows:
                state.flow_served.pop(key, None)
        self._grant()
        self._forget(tenant)

    def _forget(self, tenant: str) -> None:
        state = self._tenants.get(tenant)
        if state is not None and not state.held and not state.flows:
            del self._tenants[tenant]

    def _grant(self) -> None:
        while self.in_flight < self._capacity():
            picked = self._pick()
            if picked is None:
                return
            state, key = picked
            queue = state.flows[key]
            fut = queue.popleft()
            if not queue:
                del state.flows[key]
            if fut.done():  # cancelled while waiting; its task removes nothing more
                continue
            self._take(state, key)
            fut.set_result(None)

    def _pick(self) -> tuple[_Tenant, _Key] | None:
        candidates = [s for s in self._tenants.values() if s.flows]
        if not candidates:
            return None
        state = min(candidates, key=lambda s: (s.held, s.served))
        tier = min(k[0] for k in state.flows)  # a call (tier 0) first, then by priority
        key = min(
            (k for k in state.flows if k[0] == tier),
            key=lambda k: (state.flow_held.get(k, 0), state.flow_served.get(k, 0)),
        )
        return state, key


def check_priority(metadata: dict[str, str] | None) -> None:
    """Refuse a batch whose ``metadata.priority`` is not one the gate knows (400), rather than
    run it at a priority it did not ask for."""
    value = (metadata or {}).get("priority")
    if value is not None and value.strip().lower() not in BATCH_PRIORITIES:
        raise APIError(
            400,
            f"metadata.priority must be one of {', '.join(BATCH_PRIORITIES)}, not {value[:50]!r}",
            param="metadata.priority",
        )
