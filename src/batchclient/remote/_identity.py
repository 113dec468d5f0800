"""What identifies a remote model for the result cache: replica URLs without credentials and
what the server's ``GET /models`` says about the weights behind a name."""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_SECRET_PARAM = re.compile(r"key|token|secret|sig|pass|auth|cred", re.IGNORECASE)
CREATED_IS_NOW_S = 120.0
"""A model's ``created`` this close (seconds) to the local clock is taken to be the time of the
answer, not of the model: vLLM stamps every ``/models`` listing with the current time."""


def public_url(url: str) -> str:
    """``url`` without credentials: no ``user:password@`` and no query parameter whose name
    looks like a secret (``api_key``, ``token``, ``sig``, ...)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    query = [(k, v) for k, v in parse_qsl(parts.query) if not _SECRET_PARAM.search(k)]
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), urlencode(query), ""))


def served_model_facts(card: dict[str, Any]) -> dict[str, Any]:
    """What a ``/models`` entry says about the weights behind a name: ``root`` (vLLM: the
    model path), ``parent``, ``owned_by``, ``max_model_len`` and ``created`` when it is a
    property of the model (see :data:`CREATED_IS_NOW_S`)."""
    keys = ("root", "parent", "owned_by", "max_model_len")
    facts: dict[str, Any] = {k: card[k] for k in keys if k in card}
    created = card.get("created")
    if isinstance(created, int | float) and abs(created - time.time()) > CREATED_IS_NOW_S:
        facts["created"] = created
    return facts
