"""``GET /metrics``: the server's Prometheus series, in a registry of the app's own (never
``prometheus_client``'s global one, so two apps in one process never mix their figures).

- read from each tenant's state database at scrape time (one aggregate query per tenant, so
  they survive restarts): ``batchclient_batches{tenant,status}`` and
  ``batchclient_batch_requests_total{tenant,outcome="completed"|"failed"|"cached"}``
  (``completed`` counts answers the provider gave, ``cached`` those the result cache gave);
- counted by the provider wrapper :class:`MeteredProvider` (every request sent to the provider,
  batch lines and one-request calls; cache hits are not sent): ``batchclient_requests_in_flight``,
  ``batchclient_request_duration_seconds`` and ``batchclient_tokens_total{kind}``;
- ``batchclient_recovered_batches_total{tenant}``: batches this process took back up from one
  that ended (at start, and later when a scan finds one);
- counted by the ASGI middleware :class:`HTTPMetrics`: ``batchclient_http_requests_total{method,
  route,status,tenant}`` and ``batchclient_http_request_duration_seconds{method,route}``.
  ``route`` is the route's template (``/v1/batches/{batch_id}``; the status page's ``/``,
  ``/signin``, ``/signout``), ``unmatched`` for an unknown path, so series stay few whatever
  clients send.

``tenant`` is the tenant id (``default`` without keys, else the SHA-256-derived id of its key
that names its state directory): never a key.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator

import anyio
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .._core.provider import DelegatingProvider, Provider
from .._core.request import Request as ProviderRequest
from .._core.request import Result
from .._core.usage import TOKEN_KINDS, token_counts
from ..jobs._manager import StatusTotals
from ..types import BatchStatus
from ._guard import Guard
from ._middleware import ROUTE_SCOPE_KEY, TENANT_SCOPE_KEY, Observed
from ._tenants import Tenants

_STATUSES = sorted(BatchStatus.ACTIVE | BatchStatus.TERMINAL)
_REQUEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_HTTP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    """The series of one app (see the module docstring); ``registry`` is its own."""

    def __init__(self, tenants: Tenants | None = None) -> None:
        self.tenants = tenants
        """Whose databases are read (set by ``create_app`` once they exist)."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = RequestStats()
        self.http_requests = Counter(
            "batchclient_http_requests",
            "HTTP requests answered, by method, route template, status and tenant.",
            ["method", "route", "status", "tenant"],
            registry=r,
        )
        self.http_duration = Histogram(
            "batchclient_http_request_duration_seconds",
            "Seconds to answer an HTTP request (to the end of its body), by route template.",
            ["method", "route"],
            buckets=_HTTP_BUCKETS,
            registry=r,
        )
        self._totals: dict[str, dict[str, StatusTotals]] = {}
        self._recovered: dict[str, int] = {}
        self._scrape = anyio.Lock()
        r.register(_StoreCollector(self))
        r.register(_RequestCollector(self.requests))

    async def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """Every series (the database ones read now) in the format the ``Accept`` header asks
        for (Prometheus text 0.0.4 by default, or OpenMetrics), and its content type."""
        encoder, content_type = choose_encoder(accept)
        async with self._scrape:  # concurrent scrapes take turns over the snapshot
            totals: dict[str, dict[str, StatusTotals]] = {}
            recovered: dict[str, int] = {}
            for tenant in self.tenants.tenants if self.tenants else ():
                if tenant.client.is_open:
                    totals[tenant.id] = await tenant.client.batches.totals()
                    recovered[tenant.id] = len(tenant.client.batches.recovered)
            self._totals, self._recovered = totals, recovered
            return encoder(self.registry), content_type

    async def response(self, request: Request) -> Response:
        body, content_type = await self.exposition(request.headers.get("accept", ""))
        return Response(body, headers={"content-type": content_type})


class _StoreCollector(Collector):
    """The series read from the databases: :meth:`Metrics.exposition` refreshes the snapshot
    just before the registry is collected."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return []  # families are built at collection time

    def collect(self) -> Iterator[Metric]:
        batches = GaugeMetricFamily(
            "batchclient_batches", "Batches in the state database, by status.",
            labels=["tenant", "status"],
        )  # fmt: skip
        requests = CounterMetricFamily(
            "batchclient_batch_requests",
            "Finished batch lines: completed (answered by the provider), failed, cached "
            "(answered by the result cache).",
            labels=["tenant", "outcome"],
        )
        for tenant, per_status in self.metrics._totals.items():
            completed = failed = cached = 0
            for status in _STATUSES:
                row = per_status.get(status)
                batches.add_metric([tenant, status], row.batches if row else 0)
            for row in per_status.values():
                completed += row.completed - row.cache_hits
                failed += row.failed
                cached += row.cache_hits
            requests.add_metric([tenant, "completed"], completed)
            requests.add_metric([tenant, "failed"], failed)
            requests.add_metric([tenant, "cached"], cached)
        yield batches
        yield requests
        recovered = CounterMetricFamily(
            "batchclient_recovered_batches",
            "Batches left unfinished by a process that ended and taken back up by this one.",
            labels=["tenant"],
        )
        for tenant, count in self.metrics._recovered.items():
            recovered.add_metric([tenant], count)
        yield recovered


class RequestStats:
    """What :class:`MeteredProvider` counts, as plain numbers: it runs for every request, on
    the event loop's thread, so no lock (``prometheus_client``'s metric objects take one per
    update: about 3 µs a request where this takes under 1 µs); read at scrape time."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.tokens = dict.fromkeys(TOKEN_KINDS, 0)  # by class (``_core.usage``)
        # per outcome: a count per bucket (the last one +Inf), and the sum of seconds
        self.buckets = {"completed": [0] * (len(_REQUEST_BUCKETS) + 1),
                        "failed": [0] * (len(_REQUEST_BUCKETS) + 1)}  # fmt: skip
        self.seconds = {"completed": 0.0, "failed": 0.0}

    def observe(self, outcome: str, seconds: float) -> None:
        self.buckets[outcome][bisect_left(_REQUEST_BUCKETS, seconds)] += 1
        self.seconds[outcome] += seconds


class _RequestCollector(Collector):
    def __init__(self, stats: RequestStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        yield GaugeMetricFamily(
            "batchclient_requests_in_flight", "Requests being run by the provider now.",
            value=s.in_flight,
        )  # fmt: skip
        durations = HistogramMetricFamily(
            "batchclient_request_duration_seconds",
            "Seconds the provider took per request (batch lines and calls), by outcome.",
            labels=["outcome"],
        )
        for outcome, counts in s.buckets.items():
            cumulative, buckets = 0, []
            for bound, count in zip((*_REQUEST_BUCKETS, math.inf), counts, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), cumulative))
            durations.add_metric([outcome], buckets, s.seconds[outcome])
        yield durations
        tokens = CounterMetricFamily(
            "batchclient_tokens",
            "Tokens of the provider's answers (usage) by kind: prompt (all input), cached and "
            "cache_write (input read from and written to a prompt cache), completion, reasoning "
            "(of the completion).",
            labels=["kind"],
        )
        for kind, count in s.tokens.items():
            tokens.add_metric([kind], count)
        yield tokens


class MeteredProvider(DelegatingProvider):
    """``inner`` with every ``execute`` counted in ``metrics`` (in flight, duration by
    outcome, tokens from the answer's ``usage``)."""

    def __init__(self, inner: Provider, metrics: Metrics) -> None:
        super().__init__(inner)
        self._stats = metrics.requests

    async def execute(self, request: ProviderRequest) -> Result:
        stats = self._stats
        stats.in_flight += 1
        started = time.perf_counter()
        outcome = "failed"
        try:
            result = await self.inner.execute(request)
            if result.ok:
                outcome = "completed"
                usage = result.body.get("usage") if result.body else None
                if isinstance(usage, dict):
                    tokens = stats.tokens
                    for kind, count in zip(TOKEN_KINDS, token_counts(usage), strict=True):
                        tokens[kind] += count
            return result
        finally:
            stats.in_flight -= 1
            stats.observe(outcome, time.perf_counter() - started)


class HTTPMetrics(Observed):
    """ASGI middleware (outermost): counts every HTTP request with its route template,
    method, status and tenant, and observes its duration."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    def observe(self, scope: Scope, status: int, seconds: float) -> None:
        route = getattr(scope.get("route"), "path", None) or scope.get(ROUTE_SCOPE_KEY)
        template = route or (scope["path"] if scope["path"] in _PROBES else "unmatched")
        method = scope["method"] if scope["method"] in _METHODS else "other"
        tenant = getattr(scope.get(TENANT_SCOPE_KEY), "id", "none")
        m = self.metrics
        m.http_requests.labels(method, template, str(status), tenant).inc()
        m.http_duration.labels(method, template).observe(seconds)


_PROBES = frozenset({"/health", "/ready"})  # answered before routing, by the Probes middleware
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


def metrics_app(metrics: Metrics, *, allowed_hosts: Iterable[str] = ()) -> ASGIApp:
    """A bare ASGI app answering ``GET /metrics`` only (for a port of its own, on loopback,
    without keys); 404 for anything else. A ``Host`` that is neither a loopback name nor one of
    ``allowed_hosts`` gets 421, as on the main port (a page elsewhere rebinding its name to
    127.0.0.1 must not read the series). Serve it with the main port's
    :func:`~batchclient.server.uvicorn_options` for the same connection limits."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        if request.url.path == "/metrics" and request.method in ("GET", "HEAD"):
            response = await metrics.response(request)
        else:
            response = Response(b"not found\n", status_code=404, media_type="text/plain")
        await response(scope, receive, send)

    return Guard(app, allowed_hosts=allowed_hosts)
