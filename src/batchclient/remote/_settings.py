"""The remote provider's HTTP settings objects, with every default in one place.

The everyday knobs (``max_concurrency``, ``max_retries``, ``timeout_s``, ``rpm``, ``tpm``,
``headers``, ``default_query``, ``proxy``, ``verify``: ``RemoteOptions``) are plain keyword
arguments of ``RemoteBatchInference``; these group the rest, with the router's and the
retries' policies in ``batchclient._routing.settings``. ``docs/remote.md`` explains each.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

__all__ = ["HttpOptions", "Timeouts", "Verify"]


@dataclass(frozen=True)
class Timeouts:
    """Timeouts other than the per-attempt ``timeout_s``: ``connect_s`` to open a connection
    (also bounded by the attempt's own timeout), ``list_models_s`` for ``GET /models``
    (seconds)."""

    connect_s: float = 30.0
    list_models_s: float = 10.0


@dataclass(frozen=True)
class HttpOptions:
    """The transport's rarer settings.

    ``client_cert``: a client certificate for mutual TLS: a PEM file with the certificate (and
    its key), or ``(certificate file, key file)``; ``client_key_password`` decrypts the key.
    ``max_response_bytes``: the largest answer read, decompressed (default 64 MiB); a larger
    one is that item's ``response_too_large`` error. ``keepalive_expiry_s``: an idle
    keep-alive connection is closed after this many seconds (default 10; load balancers and
    NATs commonly drop idle connections after 30-350 s, servers such as uvicorn after 5 s).
    """

    client_cert: str | tuple[str, str] | None = None
    client_key_password: str | None = None
    max_response_bytes: int = 64 << 20
    keepalive_expiry_s: float = 10.0


Verify = bool | str | os.PathLike[str] | ssl.SSLContext
"""TLS verification: True (system CAs), a CA bundle file or directory, an ``SSLContext``, or
False."""
