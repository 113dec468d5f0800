"""Webhooks: a signed POST to the operator's URL whenever a batch ends.

Every batch that reaches ``completed``, ``failed``, ``expired`` or ``cancelled`` gets an event in
OpenAI's shape, one per state it reaches (a failed batch that is resumed and then completes
gets ``batch.failed``, then ``batch.completed``)::

    {"id": "evt_...", "object": "event", "created_at": 1764000000,
     "type": "batch.completed", "data": {"id": "batch_..."}}

signed per the Standard Webhooks specification: headers ``webhook-id`` (the event's id, the
same on every attempt, so receivers deduplicate by it), ``webhook-timestamp`` (seconds, the
attempt's time) and ``webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``
keyed by the base64-decoded part of the ``whsec_...`` secret. The openai SDK's
``client.webhooks.unwrap(body, headers, secret=...)`` verifies and parses them.

Durability: the events are written by SQLite triggers on the ``jobs`` table, in the transaction
that makes the batch terminal, into the outbox table ``webhook_events`` of the same database.
No code path that ends a batch can forget one, and a server killed at any moment delivers what
is in the outbox after it starts again: at least once. The triggers are installed in a tenant's
database when a server with a webhook first opens it; from then on every batch that ends there
(also through ``batchclient jobs``) queues an event, delivered by the next server started with
a webhook. The secret is never stored: the outbox holds events, the signature is made at each
attempt from the secret the server was given.

Delivery: up to :data:`MAX_IN_FLIGHT_PER_TENANT` events of each tenant at once, so a receiver
slow to answer one event holds neither the tenant's next events nor other tenants'. A 2xx
answer within :attr:`Deliverer.timeout_s` is success; anything else (a 3xx too:
redirects are never followed) is retried
with exponential backoff (1 s, 2 s, 4 s, ... up to an hour, with jitter) for up to 72 hours
after the event, then abandoned (logged, kept in the outbox with ``abandoned_at``). Only the
first :data:`ANSWER_CAP_BYTES` of an answer are read (a longer or endless one closes the
connection: the status decides), and an error's text is logged and stored with the URL's path
and query cut out (aiohttp quotes the URL in some errors; the path or query may hold a token).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import anyio

from .._state import Connection, Migration, Schema
from .._version import __version__
from ..errors import ConfigurationError
from ..jobs._store import Store
from ..types import BatchStatus

logger = logging.getLogger("batchclient.server.webhooks")

ANSWER_CAP_BYTES = 64 * 1024
"""How much of a receiver's answer is read. The status alone decides; the body is read so the
connection can be used again, and a receiver that answers more (500 MB, or an endless chunked
body) only loses its connection."""

SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24
"""The Standard Webhooks specification: secrets are 24 to 64 random bytes."""
MAX_SECRET_BYTES = 64
MAX_IN_FLIGHT_PER_TENANT = 4
"""Deliveries of one tenant's events at once (aiohttp's connection pool bounds them all: 100)."""
POLL_S = 1.0
"""How often the outboxes are read for due events, seconds."""
BASE_DELAY_S = 1.0
"""The wait after a first failed attempt, seconds (doubled after each next one)."""

_TERMINAL_SQL = "(" + ", ".join(f"'{s}'" for s in sorted(BatchStatus.TERMINAL)) + ")"
_INSERT_EVENT = (
    "INSERT OR IGNORE INTO webhook_events (id, batch_id, type, created_at) VALUES "
    "('evt_' || lower(hex(randomblob(16))), NEW.id, 'batch.' || NEW.status, "
    "CAST(strftime('%s', 'now') AS INTEGER))"
)


_COLUMNS = (
    "id TEXT PRIMARY KEY, batch_id TEXT NOT NULL, type TEXT NOT NULL, "
    "created_at INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, "
    "next_attempt_at REAL NOT NULL DEFAULT 0, delivered_at INTEGER, abandoned_at INTEGER, "
    "last_error TEXT"
)
_TRIGGERS = ("webhook_on_terminal", "webhook_on_terminal_insert")
_DUE = (
    "SELECT id, batch_id, type, created_at, attempts FROM webhook_events "
    "WHERE delivered_at IS NULL AND abandoned_at IS NULL AND next_attempt_at <= ? "
    "ORDER BY next_attempt_at, created_at LIMIT ?"
)


def _create(db: Connection) -> None:
    if db.dialect == "postgresql":  # made in version 2's shape, with a trigger function
        unique = "UNIQUE (batch_id, type)"
        db.execute(f"CREATE TABLE IF NOT EXISTS webhook_events ({_COLUMNS}, {unique})")
        _index_and_pg_trigger(db)
        return
    db.execute(f"CREATE TABLE IF NOT EXISTS webhook_events ({_COLUMNS}, UNIQUE (batch_id))")
    _index_and_triggers(db)


def _one_event_per_state(db: Connection) -> None:
    """Version 2: one event per batch and terminal state (version 1 kept one per batch, so a
    resumed batch's final state was never sent). The table is copied into the new shape; the
    triggers that write it are made again around the swap."""
    if db.dialect == "postgresql":
        return  # made in this shape by version 1
    for name in _TRIGGERS:
        db.execute(f"DROP TRIGGER IF EXISTS {name}")
    db.execute("DROP INDEX IF EXISTS webhook_events_due")
    db.execute(f"CREATE TABLE webhook_events_new ({_COLUMNS}, UNIQUE (batch_id, type))")
    columns = (
        "id, batch_id, type, created_at, attempts, next_attempt_at, delivered_at, "
        "abandoned_at, last_error"
    )
    db.execute(f"INSERT INTO webhook_events_new ({columns}) SELECT {columns} FROM webhook_events")
    db.execute("DROP TABLE webhook_events")
    db.execute("ALTER TABLE webhook_events_new RENAME TO webhook_events")
    _index_and_triggers(db)


def _due_index(db: Connection) -> None:
    db.execute(
        "CREATE INDEX IF NOT EXISTS webhook_events_due ON webhook_events (next_attempt_at) "
        "WHERE delivered_at IS NULL AND abandoned_at IS NULL"
    )


def _index_and_pg_trigger(db: Connection) -> None:
    """PostgreSQL's spelling of the triggers below: one function, on insert and update."""
    _due_index(db)
    db.execute(
        "CREATE OR REPLACE FUNCTION webhook_event() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN IF NEW.status IN {_TERMINAL_SQL} AND (TG_OP = 'INSERT' OR OLD.status NOT IN "
        f"{_TERMINAL_SQL}) THEN INSERT INTO webhook_events (id, batch_id, type, created_at) "
        "VALUES ('evt_' || replace(gen_random_uuid()::text, '-', ''), NEW.id, "
        "'batch.' || NEW.status, extract(epoch FROM now())::bigint) ON CONFLICT DO NOTHING; "
        "END IF; RETURN NEW; END $$"
    )
    db.execute(
        f"CREATE OR REPLACE TRIGGER {_TRIGGERS[0]} AFTER INSERT OR UPDATE OF status ON jobs "
        "FOR EACH ROW EXECUTE FUNCTION webhook_event()"
    )


def _index_and_triggers(db: Connection) -> None:
    _due_index(db)
    # a status change into a terminal state, and a batch inserted already terminal (one that
    # fails validation at creation): both queue the event in the same transaction
    db.execute(
        f"CREATE TRIGGER IF NOT EXISTS {_TRIGGERS[0]} AFTER UPDATE OF status ON jobs "
        f"WHEN NEW.status IN {_TERMINAL_SQL} AND OLD.status NOT IN {_TERMINAL_SQL} "
        f"BEGIN {_INSERT_EVENT}; END"
    )
    db.execute(
        f"CREATE TRIGGER IF NOT EXISTS {_TRIGGERS[1]} AFTER INSERT ON jobs "
        f"WHEN NEW.status IN {_TERMINAL_SQL} BEGIN {_INSERT_EVENT}; END"
    )


SCHEMA = Schema("webhooks", (Migration(1, _create), Migration(2, _one_event_per_state)))


@dataclass(frozen=True)
class Webhook:
    """Where events go (``url``) and the key they are signed with (the decoded secret). Neither
    the key nor the URL's path or query is shown by ``repr``. Make one with :meth:`parse`."""

    url: str
    key: bytes = field(repr=False)

    def __repr__(self) -> str:
        return f"Webhook({self.shown!r})"

    @classmethod
    def parse(cls, url: str, secret: str) -> Webhook:
        """Check ``url`` (http or https, with a host) and ``secret`` (``whsec_`` then the
        base64 of 24 to 64 bytes); raise ``ConfigurationError`` otherwise. The error never
        quotes the secret, nor the URL's path or query."""
        try:
            parts = urlsplit(url)
            _ = parts.port  # raises on a port out of range or not a number
        except ValueError as exc:
            raise ConfigurationError(f"the webhook URL is not a valid URL ({exc})") from None
        if any(c.isspace() or not c.isprintable() for c in url):
            raise ConfigurationError(
                "the webhook URL must not hold spaces or control characters (percent-encode them)"
            )
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(
                "the webhook URL must be an absolute http:// or https:// URL with a host"
            )
        if not secret.startswith(SECRET_PREFIX):
            raise ConfigurationError(
                f"the webhook secret must start with {SECRET_PREFIX!r} (Standard Webhooks); "
                'make one with `echo "whsec_$(openssl rand -base64 32)"`'
            )
        try:
            key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
        except (binascii.Error, ValueError):
            raise ConfigurationError(
                f"the webhook secret after {SECRET_PREFIX!r} must be base64"
            ) from None
        if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
            raise ConfigurationError(
                f"the webhook secret must encode {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} "
                f"bytes, not {len(key)}"
            )
        return cls(url, key)

    def redact(self, text: str) -> str:
        """``text`` with this URL shown as :attr:`shown`, and its path and query cut out
        wherever they appear alone."""
        parts = urlsplit(self.url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        text = text.replace(self.url, self.shown)
        for secret in (target, parts.query):
            if secret.strip("/"):
                text = text.replace(secret, "/…")
        return text

    @property
    def shown(self) -> str:
        """The URL for logs: scheme, host and port only (a path or query may hold a token, as
        Slack's and Discord's webhook URLs do)."""
        parts = urlsplit(self.url)
        port = f":{parts.port}" if parts.port else ""
        rest = "/…" if parts.path.strip("/") or parts.query else ""
        return f"{parts.scheme}://{parts.hostname}{port}{rest}"


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header: ``v1,`` and the base64 HMAC-SHA256 of
    ``{msg_id}.{timestamp}.{body}`` (Standard Webhooks)."""
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


@dataclass(frozen=True)
class Event:
    """One row of the outbox."""

    id: str
    batch_id: str
    type: str
    created_at: int
    attempts: int

    def body(self) -> bytes:
        """The JSON sent: the same bytes on every attempt."""
        event = {
            "id": self.id,
            "object": "event",
            "created_at": self.created_at,
            "type": self.type,
            "data": {"id": self.batch_id},
        }
        return json.dumps(event, separators=(",", ":")).encode()


class Outbox:
    """The ``webhook_events`` table of one tenant's database (opened, with the jobs' tables,
    and migrated to the triggers on construction). Blocking: call through a thread."""

    def __init__(self, state_dir: Path) -> None:
        self.store = Store(state_dir)  # its own connection: the jobs' tables exist
        try:
            self.store.db.migrate(SCHEMA)
        except BaseException:
            self.store.close()
            raise
        self.db = self.store.db

    def due(self, now: float, limit: int = 100, claim_s: float = 60.0) -> list[Event]:
        """Up to ``limit`` events due at ``now``. In a database shared by several servers
        they are claimed: each is not due again for ``claim_s`` (more than an attempt takes)
        unless its attempt is recorded first, so servers never send one event at once, and an
        event whose sender died is sent again by whichever server finds it due then. (One
        server on its own SQLite file sends what it finds, at once after a restart too.)"""
        if not self.store.shared:
            return [Event(*r) for r in self.db.all(_DUE, (now, limit))]
        with self.db.transaction() as db:
            rows = db.execute(_DUE, (now, limit)).fetchall()
            if rows:
                db.executemany(
                    "UPDATE webhook_events SET next_attempt_at = ? WHERE id = ?",
                    [(now + claim_s, r[0]) for r in rows],
                )
        return [Event(*r) for r in rows]

    def delivered(self, event_id: str) -> None:
        self.db.write(
            "UPDATE webhook_events SET delivered_at = ?, attempts = attempts + 1, "
            "last_error = NULL WHERE id = ?",
            (int(time.time()), event_id),
        )

    def failed(self, event_id: str, error: str, retry_at: float | None) -> None:
        """Record a failed attempt; ``retry_at`` None: give the event up."""
        if retry_at is None:
            self.db.write(
                "UPDATE webhook_events SET attempts = attempts + 1, last_error = ?, "
                "abandoned_at = ? WHERE id = ?",
                (error, int(time.time()), event_id),
            )
        else:
            self.db.write(
                "UPDATE webhook_events SET attempts = attempts + 1, last_error = ?, "
                "next_attempt_at = ? WHERE id = ?",
                (error, retry_at, event_id),
            )

    def close(self) -> None:
        self.store.close()


@dataclass
class Deliverer:
    """Sends what the outboxes hold to ``webhook``, polling every ``poll_s`` seconds. Each
    failed attempt waits ``base_delay_s`` × 2^(attempts - 1), at most ``max_delay_s``, times
    a random 0.5-1 (so receivers that come back are not hit by every server at once); an event
    older than ``give_up_after_s`` is abandoned."""

    webhook: Webhook
    outboxes: Sequence[Outbox]
    poll_s: float = POLL_S
    timeout_s: float = 10.0
    base_delay_s: float = BASE_DELAY_S
    max_delay_s: float = 3600.0
    give_up_after_s: float = 72 * 3600.0
    max_in_flight_per_tenant: int = MAX_IN_FLIGHT_PER_TENANT

    async def run(self) -> None:
        """Deliver until cancelled: each poll starts the due events of every outbox that has
        fewer than ``max_in_flight_per_tenant`` on their way, without waiting for them."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        sending: dict[int, set[str]] = {i: set() for i in range(len(self.outboxes))}
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            anyio.create_task_group() as tg,
        ):
            while True:
                for i, outbox in enumerate(self.outboxes):
                    ours = sending[i]
                    if len(ours) >= self.max_in_flight_per_tenant:
                        continue
                    try:
                        room = self.max_in_flight_per_tenant - len(ours)  # claim what starts
                        claim_s = 3 * self.timeout_s + 30
                        events = await anyio.to_thread.run_sync(
                            outbox.due, time.time(), room, claim_s
                        )
                    except Exception:  # a full disk, a bug: never take the server down
                        logger.exception("webhooks: reading %s failed", outbox.db.path)
                        continue
                    for event in events:
                        if len(ours) >= self.max_in_flight_per_tenant:
                            break
                        if event.id not in ours:
                            ours.add(event.id)
                            tg.start_soon(self._deliver, session, outbox, event, ours)
                await anyio.sleep(self.poll_s)

    async def _deliver(
        self, session: aiohttp.ClientSession, outbox: Outbox, event: Event, sending: set[str]
    ) -> None:
        try:
            await self._attempt(session, outbox, event)
        except Exception:  # a full disk, a bug: never take the server down
            logger.exception("webhooks: delivery from %s failed", outbox.db.path)
        finally:
            sending.discard(event.id)

    async def _attempt(self, session: aiohttp.ClientSession, outbox: Outbox, event: Event) -> None:
        body = event.body()
        timestamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": f"batchclient/{__version__}",
            "webhook-id": event.id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(self.webhook.key, event.id, timestamp, body),
        }
        error: str | None = None
        try:
            # a redirect is not followed: the signed event goes to the configured URL only
            async with session.post(
                self.webhook.url, data=body, headers=headers, allow_redirects=False
            ) as response:
                await _drain(response, ANSWER_CAP_BYTES)
                if not 200 <= response.status < 300:
                    error = f"HTTP {response.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            error = self.webhook.redact(type(exc).__name__ + (f": {exc}" if str(exc) else ""))
        if error is None:
            await anyio.to_thread.run_sync(outbox.delivered, event.id)
            logger.info("webhook %s %s delivered to %s", event.type, event.id, self.webhook.shown)
            return
        attempts = event.attempts + 1
        retry_at: float | None = time.time() + self.delay(attempts)
        if retry_at is not None and retry_at - event.created_at > self.give_up_after_s:
            retry_at = None  # past give_up_after_s: a receiver gone this long will not want it
        await anyio.to_thread.run_sync(outbox.failed, event.id, error, retry_at)
        logger.warning(
            "webhook %s %s to %s: attempt %d failed (%s); %s",
            event.type,
            event.id,
            self.webhook.shown,
            attempts,
            error,
            "given up" if retry_at is None else f"retrying in {retry_at - time.time():.1f} s",
        )

    def delay(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed attempt."""
        capped = min(self.max_delay_s, self.base_delay_s * 2.0 ** min(attempts - 1, 40))
        return capped * random.uniform(0.5, 1.0)


async def _drain(response: aiohttp.ClientResponse, cap: int) -> None:
    """Read ``response``'s body to its end if it has at most ``cap`` bytes; past that, close
    the connection (the rest is never read)."""
    seen = 0
    while chunk := await response.content.readany():
        seen += len(chunk)
        if seen > cap:
            response.close()
            return


@asynccontextmanager
async def delivering(webhook: Webhook | None, state_dirs: Sequence[Path]) -> AsyncIterator[None]:
    """Open the outboxes of ``state_dirs`` (installing the triggers) and deliver their events
    while inside; nothing without a ``webhook``. Enter it before the tenants' clients, so the
    batches they resume already queue events."""
    if webhook is None:
        yield
        return
    outboxes = [Outbox(d) for d in state_dirs]
    try:
        async with anyio.create_task_group() as tg:
            deliverer = Deliverer(webhook, outboxes, poll_s=POLL_S, base_delay_s=BASE_DELAY_S)
            tg.start_soon(deliverer.run)
            logger.info("webhooks to %s", webhook.shown)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
    finally:
        for outbox in outboxes:
            outbox.close()
