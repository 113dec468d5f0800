"""The status page at ``/``: the signed-in tenant's batches (:mod:`._page_render`).

An ASGI middleware outside :class:`~._middleware.Authenticate` answers ``GET /``,
``POST /signin`` and ``POST /signout`` itself and hands every other request on:

- without keys there is one tenant and no sign-in: ``GET /`` shows its batches;
- with keys, ``GET /`` shows the batches of the tenant of the request's session cookie (or of
  its ``Authorization: Bearer`` header), else the sign-in form. The form POSTs the key in the
  body; a right key gets a cookie holding a random session token (never the key, nor anything
  derived from it) that is ``HttpOnly``, ``SameSite=Strict``, ``Path=/`` (and ``Secure`` over
  HTTPS), valid :data:`SESSION_S` seconds; the server keeps ``token -> tenant`` in memory, so a
  restart signs everyone out. The cookie opens only this page, never an API route, so a page
  elsewhere cannot use it to act on the API. Each tenant keeps its
  :data:`MAX_SESSIONS_PER_TENANT` newest sessions, so no tenant's sign-ins sign another out;
  each client address gets :data:`MAX_SIGNINS` sign-in attempts per :data:`SIGNIN_WINDOW_S`
  seconds, then 429 with ``Retry-After`` (a key cannot be guessed at speed).

Answers carry ``Cache-Control: no-store`` and a content security policy allowing no script.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import OrderedDict, deque
from pathlib import Path
from urllib.parse import parse_qs

from anyio import to_thread
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import ErrorCode
from ..jobs import JobManager
from ..types import Batch
from ._errors import error_response, redact_paths, redacted_batch
from ._middleware import ROUTE_SCOPE_KEY
from ._page_render import Capacity, LineError, sign_in_page, status_page
from ._tenants import Tenant, Tenants

COOKIE = "batchclient_session"
SESSION_S = 12 * 3600
"""How long a sign-in lasts."""
MAX_SESSIONS_PER_TENANT = 100
"""Sessions kept per tenant (its oldest are forgotten first)."""
MAX_SIGNINS = 20
SIGNIN_WINDOW_S = 60.0
"""Sign-in attempts allowed per client address in any ``SIGNIN_WINDOW_S`` seconds."""
MAX_ADDRESSES = 10_000
"""Client addresses whose recent sign-ins are remembered (the least recent are forgotten)."""
MAX_ENDED = 10_000
"""Finished batches whose failed lines are kept in memory for the page."""
MAX_FORM_BYTES = 4096
MAX_FORM_FIELDS = 10
"""The sign-in form's limits; a longer form gets 400 in OpenAI's error envelope."""
PAGE_BATCHES = 50
"""Batches shown, newest first."""
ERRORS_PER_BATCH = 3
"""Failed lines shown per batch (its first ones)."""

_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with the
    # sign-in form, which the server's origin check refuses like any foreign page
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
}


class Sessions:
    """``token -> (tenant id, expiry)``, in memory, at most :data:`MAX_SESSIONS_PER_TENANT`
    per tenant."""

    def __init__(self) -> None:
        self._by_token: dict[str, tuple[str, float]] = {}
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}  # oldest first

    def open(self, tenant: str) -> str:
        token = secrets.token_urlsafe(32)
        self._by_token[token] = (tenant, time.monotonic() + SESSION_S)
        own = self._by_tenant.setdefault(tenant, OrderedDict())
        own[token] = None
        while len(own) > MAX_SESSIONS_PER_TENANT:
            oldest, _ = own.popitem(last=False)
            self._by_token.pop(oldest, None)
        return token

    def tenant(self, token: str | None) -> str | None:
        if not token:
            return None
        found = self._by_token.get(token)
        if found is None:
            return None
        tenant, expires = found
        if expires < time.monotonic():
            self.close(token)
            return None
        return tenant

    def close(self, token: str | None) -> None:
        found = self._by_token.pop(token, None) if token else None
        if found is not None:
            self._by_tenant[found[0]].pop(str(token), None)


class SignIns:
    """Sign-in attempts by client address over the last :data:`SIGNIN_WINDOW_S` seconds."""

    def __init__(self) -> None:
        self._by_address: OrderedDict[str, deque[float]] = OrderedDict()

    def wait_s(self, address: str) -> float:
        """0 and the attempt counted, or the seconds until ``address`` may try again."""
        now = time.monotonic()
        recent = self._by_address.pop(address, None) or deque()
        while recent and recent[0] <= now - SIGNIN_WINDOW_S:
            recent.popleft()
        self._by_address[address] = recent  # the most recent last
        while len(self._by_address) > MAX_ADDRESSES:
            self._by_address.popitem(last=False)
        if len(recent) >= MAX_SIGNINS:
            return recent[0] + SIGNIN_WINDOW_S - now
        recent.append(now)
        return 0.0


class StatusPage:
    def __init__(self, app: ASGIApp, tenants: Tenants) -> None:
        self.app = app
        self.tenants = tenants
        self.sessions = Sessions()
        self.sign_ins = SignIns()
        self._by_id = {t.id: t for t in tenants.tenants}
        # the failures of finished batches, by id (they change no more): see _failures
        self._ended: OrderedDict[tuple[str, str, int, int], tuple[list[LineError], int]] = (
            OrderedDict()
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (scope.get("method"), _route_path(scope))
        if scope["type"] != "http" or route not in _ROUTES:
            await self.app(scope, receive, send)
            return
        scope[ROUTE_SCOPE_KEY] = route[1]  # the metrics' label: a template, not the raw path
        request = Request(scope, receive)
        response = await getattr(self, _ROUTES[route])(request)
        response.headers.update(_HEADERS)
        await response(scope, receive, send)

    async def page(self, request: Request) -> Response:
        if not self.tenants.keyed:
            return await self._render(self.tenants.tenants[0], signed_in=False)
        tenant_id = self.sessions.tenant(request.cookies.get(COOKIE))
        tenant = self._by_id.get(tenant_id) if tenant_id else None
        if tenant is not None:
            return await self._render(tenant, signed_in=True)
        header = request.headers.get("authorization")
        tenant = self.tenants.authenticate(header.encode() if header is not None else None)
        if header is not None and tenant is not None:
            return await self._render(tenant, signed_in=False)
        return HTMLResponse(sign_in_page())

    async def sign_in(self, request: Request) -> Response:
        if not self.tenants.keyed:
            return RedirectResponse(scope_root(request) + "/", status_code=303)
        wait = self.sign_ins.wait_s(request.client.host if request.client else "")
        if wait > 0:
            return error_response(
                429,
                f"too many sign-in attempts from this address: try again in {math.ceil(wait)} s",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(math.ceil(wait))},
            )
        body = b""
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_FORM_BYTES:
                    return error_response(400, f"the sign-in form is over {MAX_FORM_BYTES} bytes")
        except ClientDisconnect:
            return error_response(400, "the client closed the connection during the request")
        try:
            fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=MAX_FORM_FIELDS)
        except ValueError:  # more fields than that
            return error_response(400, f"the sign-in form has over {MAX_FORM_FIELDS} fields")
        key = (fields.get("key") or [""])[0].strip()
        tenant = self.tenants.authenticate(b"Bearer " + key.encode()) if key else None
        if tenant is None:
            return HTMLResponse(sign_in_page("That key is not valid here."), status_code=401)
        response = RedirectResponse(scope_root(request) + "/", status_code=303)
        response.set_cookie(
            COOKIE,
            self.sessions.open(tenant.id),
            max_age=SESSION_S,
            path=scope_root(request) + "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def sign_out(self, request: Request) -> Response:
        self.sessions.close(request.cookies.get(COOKIE))
        response = RedirectResponse(scope_root(request) + "/", status_code=303)
        response.delete_cookie(
            COOKIE, path=scope_root(request) + "/", httponly=True, samesite="strict"
        )
        return response

    async def _render(self, tenant: Tenant, *, signed_in: bool) -> Response:
        client = tenant.client
        batches = await client.batches.list(limit=PAGE_BATCHES)
        failures = await self._failures(client._manager(), batches)
        # as the API shows them: the error messages name no path of the server's
        roots = self.tenants.state_dirs()
        batches = [redacted_batch(b, roots) for b in batches]
        failures = {
            i: ([_line_without_paths(e, roots) for e in errors], unrun)
            for i, (errors, unrun) in failures.items()
        }
        gate = self.tenants.gate
        capacity = Capacity(
            in_flight=gate.held(tenant.id),
            waiting=gate.waiting(tenant.id),
            capacity=max(gate.capacity(), 1),
        )
        html = status_page(
            tenant.id,
            batches,
            {i: errors for i, (errors, _) in failures.items()},
            capacity,
            signed_in=signed_in,
            unrun={i: unrun for i, (_, unrun) in failures.items()},
        )
        return HTMLResponse(html)

    async def _failures(
        self, manager: JobManager, batches: list[Batch]
    ) -> dict[str, tuple[list[LineError], int]]:
        """By id of each batch with failed lines: its first :data:`ERRORS_PER_BATCH` failed
        lines that ran, and how many lines it never ran (failed ``batch_cancelled`` /
        ``batch_expired`` when it ended so). A finished batch's are read once and kept (until
        its status or counts change: a failed batch may be resumed)."""
        failing = [b for b in batches if b.request_counts.failed]
        todo = [b for b in failing if _seen_as(b) not in self._ended]
        found: dict[str, tuple[list[LineError], int]] = {}
        if todo:
            store = await manager.store()

            def read() -> None:
                for batch in todo:
                    unrun = store.count_failed(batch.id, _UNRUN) if batch.status.terminal else 0
                    errors = []
                    for row in store.iter_results(batch.id, ok=False):
                        if row.error is None or row.error.code not in _UNRUN:
                            errors.append(LineError(row.custom_id, row.error))
                            if len(errors) >= ERRORS_PER_BATCH:
                                break
                    found[batch.id] = (errors, unrun)

            await to_thread.run_sync(read)
            for batch in todo:
                if batch.status.terminal:
                    self._ended[_seen_as(batch)] = found[batch.id]
            while len(self._ended) > MAX_ENDED:
                self._ended.popitem(last=False)
        return {b.id: found.get(b.id) or self._ended[_seen_as(b)] for b in failing}


def _line_without_paths(line: LineError, roots: list[Path]) -> LineError:
    if line.error is None:
        return line
    message = redact_paths(line.error.message, roots)
    return LineError(line.custom_id, line.error.model_copy(update={"message": message}))


def _seen_as(batch: Batch) -> tuple[str, str, int, int]:
    """What a finished batch's failures are kept under: they change only with these."""
    counts = batch.request_counts
    return batch.id, batch.status, counts.completed, counts.failed


_UNRUN = (ErrorCode.batch_cancelled.value, ErrorCode.batch_expired.value)
"""The errors of the lines a cancelled or expired batch never ran."""

_ROUTES = {("GET", "/"): "page", ("POST", "/signin"): "sign_in", ("POST", "/signout"): "sign_out"}


def scope_root(request: Request) -> str:
    """Where this app is mounted (``""`` at the root)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _route_path(scope: Scope) -> str:
    """The path inside this app: mounted under ``/batch``, ``/batch/`` is ``/`` (the page's
    links and redirects are relative, so they stay under the mount)."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path
