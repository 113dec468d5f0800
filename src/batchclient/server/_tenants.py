"""Keys and tenants: each API key is a tenant with a state directory of its own.

- No key configured: one tenant, ``default``, whose state directory is the server's
  (``batchclient jobs --state-dir DIR`` sees its batches).
- Keys configured: tenant ``<id>`` lives in ``<state dir>/tenants/<id>/``, where ``id`` is
  :func:`tenant_id` of its key (a SHA-256 digest: the key itself is never stored). A
  request's ``Authorization: Bearer <key>`` is compared in constant time with every key
  (SHA-256 digests through ``hmac.compare_digest``, all keys every time), so neither timing
  nor length tells which key was close.

Every tenant is a :class:`~batchclient.BatchClient` of its own (its files, its batches, its
SQLite database) over the one provider, which is started once: the tenants' clients see it
through :class:`SharedProvider`, whose ``start`` and ``stop`` do nothing and whose ``execute``
waits its turn at the server's fair gate (:mod:`._fair`). All tenants are opened at start-up, so
batches left unfinished by a crash resume at once, whoever owns them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

import anyio

from .._core.client import BatchClient
from .._core.flows import current_flow
from .._core.provider import DelegatingProvider, Provider
from .._core.request import Request, Result
from .._state import DEFAULT_SCHEMA, bind, database_url, private_dirs
from ..errors import ConfigurationError
from ..jobs._store import default_state_dir
from ._fair import FairGate, provider_capacity
from ._idempotency import IdempotencyKeys

DEFAULT_TENANT = "default"


MIN_KEY_LENGTH = 16


def tenant_id(key: str) -> str:
    """The tenant id of an API key: the first 32 hex digits of SHA-256("batchclient tenant\0"
    + key), as API token stores keep tokens (a digest, never the token). Keys are random and
    at least :data:`MIN_KEY_LENGTH` characters, so the digest cannot be searched back to one."""
    return hashlib.sha256(b"batchclient tenant\0" + key.encode()).hexdigest()[:32]


def check_key(key: str) -> None:
    """Raise ``ConfigurationError`` unless ``key`` is at least :data:`MIN_KEY_LENGTH`
    characters of visible ASCII (it travels in an ``Authorization: Bearer`` header)."""
    if len(key) < MIN_KEY_LENGTH or any(not 0x21 <= ord(c) <= 0x7E for c in key):
        raise ConfigurationError(
            f"an API key must be at least {MIN_KEY_LENGTH} characters of visible ASCII without "
            "spaces (it is sent in an Authorization: Bearer header); make one with "
            "`openssl rand -hex 32`"
        )


class SharedProvider(DelegatingProvider):
    """A provider started and stopped by someone else (the server), shared by many clients:
    every member but ``start`` and ``stop`` (which do nothing), ``execute`` and
    ``max_in_flight`` goes to ``inner``, so the tenants' result caches are keyed by
    ``inner``'s ``cache_identity`` and their scoring calls use ``inner``'s tokenizer.
    ``execute`` waits for a slot of ``gate`` (the server's :class:`~._fair.FairGate`, one for
    all tenants) in ``tenant``'s name, then runs on ``inner``; without a gate it goes straight
    to ``inner``."""

    def __init__(
        self, inner: Provider, gate: FairGate | None = None, tenant: str = "default"
    ) -> None:
        super().__init__(inner)
        self.gate = gate
        self.tenant = tenant

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def max_in_flight(self) -> int:
        """Twice ``inner``'s behind a gate: a batch keeps requests waiting at the gate while its
        others are in flight, so a slot one of them frees can go to its next line rather than
        to a lower-priority batch (with exactly the capacity in flight, a batch holding every
        slot has nothing waiting). Waiting requests have not been sent: a crash still re-sends
        at most the capacity."""
        return self.inner.max_in_flight() * (1 if self.gate is None else 2)

    async def execute(self, request: Request) -> Result:
        if self.gate is None:
            return await self.inner.execute(request)
        async with self.gate.slot(self.tenant, current_flow()):
            return await self.inner.execute(request)


@dataclass(eq=False)
class Tenant:
    """One tenant: ``id`` (``default`` without keys), its client and its idempotency keys.
    ``create_lock`` serialises its batch creations that carry an ``Idempotency-Key``."""

    id: str
    client: BatchClient
    idempotency: IdempotencyKeys
    create_lock: anyio.Lock = field(default_factory=anyio.Lock)


class Tenants:
    """The server's tenants over one provider. ``async with``: starts the provider (or opens
    the given client unless it is open already), opens every tenant; leaving pauses their
    running batches and stops what it started.

    ``target`` is a :class:`~batchclient.Provider` or a :class:`~batchclient.BatchClient`;
    ``state_dir`` defaults to the client's, else :func:`~batchclient.jobs.default_state_dir`.
    ``cache`` turns on each tenant's result cache (kept in the tenant's own state directory, so
    tenants never share answers); None: the given client's switch, else off.
    """

    def __init__(
        self,
        target: Provider | BatchClient,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        api_keys: list[str] | tuple[str, ...] = (),
        cache: bool | None = None,
        database: str | None = None,
    ) -> None:
        if cache is None:
            cache = target.cache if isinstance(target, BatchClient) else False
        if isinstance(target, BatchClient):
            base = Path(state_dir).expanduser() if state_dir is not None else target.state_dir
            self.provider = target.provider
        elif isinstance(target, Provider):
            base = Path(state_dir).expanduser() if state_dir is not None else default_state_dir()
            self.provider = target
        else:
            raise ConfigurationError(
                f"serve a Provider or a BatchClient, not {type(target).__name__}"
            )
        self.target = target
        self.state_dir = base
        url = database_url(database)
        self.database = url
        """The shared PostgreSQL (None: SQLite files in each state directory)."""
        if url is not None:  # each tenant in its own schema, as each has its own SQLite file
            bind(base, url, DEFAULT_SCHEMA)
            for key in api_keys:
                bind(base / "tenants" / tenant_id(key), url, f"tenant_{tenant_id(key)}")
        self._keyed: list[tuple[bytes, Tenant]] = []
        self.tenants: list[Tenant] = []
        provider = self.provider
        self.gate = FairGate(lambda: provider_capacity(provider))
        if not api_keys:
            if isinstance(target, BatchClient) and base == target.state_dir:
                default = target  # the client is the one tenant (its requests skip the gate)
            else:
                shared = SharedProvider(provider, self.gate, DEFAULT_TENANT)
                default = BatchClient(shared, state_dir=base, cache=cache, database=url)
            self.tenants.append(Tenant(DEFAULT_TENANT, default, IdempotencyKeys(base)))
        for key in dict.fromkeys(api_keys):  # a key given twice is one tenant
            check_key(key)
            tid = tenant_id(key)
            directory = base / "tenants" / tid
            shared = SharedProvider(provider, self.gate, tid)
            client = BatchClient(shared, state_dir=directory, cache=cache, database=url)
            tenant = Tenant(tid, client, IdempotencyKeys(directory))
            self.tenants.append(tenant)
            self._keyed.append((hashlib.sha256(key.encode()).digest(), tenant))
        self._stack: AsyncExitStack | None = None

    def state_dirs(self) -> list[Path]:
        """The server's state directory and every tenant's (what clients never see named)."""
        return [self.state_dir, *(t.client.state_dir for t in self.tenants)]

    @property
    def keyed(self) -> bool:
        """Whether clients must send a key (keys were configured)."""
        return bool(self._keyed)

    def authenticate(self, authorization: bytes | None) -> Tenant | None:
        """The tenant of an ``Authorization`` header value (``Bearer <key>``), or None. Without
        keys every request is the default tenant's."""
        if not self._keyed:
            return self.tenants[0]
        if authorization is None:
            return None
        scheme, _, token = authorization.strip().partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            return None
        digest = hashlib.sha256(token).digest()
        match = None
        for key_digest, tenant in self._keyed:  # every key, every time: constant time
            if hmac.compare_digest(digest, key_digest):
                match = tenant
        return match

    async def __aenter__(self) -> Self:
        private_dirs(self.state_dir)
        if self._keyed:
            private_dirs(self.state_dir / "tenants")
            os.chmod(self.state_dir / "tenants", 0o700)  # the server's own, whoever made it
        stack = AsyncExitStack()
        try:
            target = self.target
            if isinstance(target, BatchClient):
                if not target.is_open:
                    await stack.enter_async_context(target)
            else:
                await stack.enter_async_context(target)  # starts the provider
            for tenant in self.tenants:
                tenant.create_lock = anyio.Lock()  # bound to the serving event loop
                if tenant.client is not target:
                    await stack.enter_async_context(tenant.client)  # resumes its batches
                stack.callback(tenant.idempotency.close)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
