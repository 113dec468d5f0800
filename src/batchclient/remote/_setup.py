"""Building the remote provider's parts from its arguments, every check made before any
connection: TLS settings, headers and secrets, one transport, rate buckets and adaptive limit
per replica, and the dispatcher over them."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .._routing.adaptive import AdaptiveSettings
from .._routing.dispatch import Dispatcher, Replica
from .._routing.rates import RateBuckets
from .._routing.settings import AdaptiveConcurrency
from .._version import __version__
from ..errors import ConfigurationError
from ._options import RemoteOptions
from ._settings import HttpOptions, Verify
from ._transport import HttpError, HttpResponse, HttpTimeout, ResponseTooLarge, Transport
from ._urls import (
    Redactor,
    check_headers,
    clean_api_key,
    parse_address,
    proxy_authorization,
    resolve_proxy,
)

__all__ = [
    "USER_AGENT",
    "RemoteReplica",
    "Verify",
    "build_dispatcher",
    "check_settings",
    "tls_settings",
]

USER_AGENT = f"batchclient/{__version__}"


@dataclass(frozen=True)
class RemoteReplica:
    """One replica with its own limits; a plain URL string in ``base_url`` means "the client's
    defaults". ``url`` is the API root (``.../v1``); ``max_concurrency`` (requests in flight
    per model), ``rpm`` (requests per minute) and ``tpm`` (tokens per minute) override the
    client's values for this replica; None keeps them."""

    url: str
    max_concurrency: int | None = None
    rpm: float | None = None
    tpm: float | None = None


def check_settings(options: RemoteOptions) -> None:
    """Raise ``ConfigurationError`` for a limit out of range (``options`` resolved)."""
    if options["max_concurrency"] < 1:
        raise ConfigurationError("max_concurrency must be >= 1")
    if options["max_retries"] < 0:
        raise ConfigurationError("max_retries must be >= 0")
    if options["timeout_s"] <= 0:
        raise ConfigurationError("timeout_s must be > 0 seconds")
    ejection = options["ejection"]
    if ejection.after < 1 or ejection.duration_s < 0 or ejection.probe_s < 0:
        raise ConfigurationError("Ejection needs after >= 1, duration_s >= 0 and probe_s >= 0")
    limits = (
        ("rpm", options["rpm"]),
        ("tpm", options["tpm"]),
        ("period_s", options["rate_limits"].period_s),
    )
    for name, value in limits:
        if value is not None and value <= 0:
            raise ConfigurationError(f"{name} must be > 0")


def tls_settings(verify: Verify, http: HttpOptions) -> ssl.SSLContext | bool:
    """What the transport passes to aiohttp as ``ssl``. Raises ``ConfigurationError`` for a CA
    bundle or client certificate that cannot be loaded (naming the file)."""
    if isinstance(verify, ssl.SSLContext):
        context = verify
        if http.client_cert is not None:
            raise ConfigurationError(
                "HttpOptions.client_cert: load the certificate into the SSLContext given as "
                "verify instead"
            )
        return context
    if verify is True and http.client_cert is None:
        return True  # aiohttp's default context: the system's CAs
    context = ssl.create_default_context()
    if verify is False:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif verify is not True:
        path = Path(verify)
        try:
            if path.is_dir():
                context.load_verify_locations(capath=str(path))
            else:
                context.load_verify_locations(cafile=str(path))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"verify={str(path)!r}: cannot load CAs: {exc}") from None
    if http.client_cert is not None:
        cert, key = (
            http.client_cert if isinstance(http.client_cert, tuple) else (http.client_cert, None)
        )
        try:
            context.load_cert_chain(cert, key, password=http.client_key_password)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(
                f"HttpOptions.client_cert {cert!r}: cannot load: {exc}"
            ) from None
    return context


def build_dispatcher(
    replicas: Sequence[RemoteReplica], *, api_key: str | None, options: RemoteOptions
) -> Dispatcher:
    """Every replica's transport, buckets and limits, from the resolved ``options``. Raises
    ``ConfigurationError`` for any bad argument (the URL shown without its userinfo; a header
    named, never its value)."""
    http, timeouts, rate_limits = options["http"], options["timeouts"], options["rate_limits"]
    adaptive, max_concurrency = options["adaptive"], options["max_concurrency"]
    if http.max_response_bytes < 1 or http.keepalive_expiry_s < 0:
        raise ConfigurationError("HttpOptions needs max_response_bytes >= 1, keepalive >= 0")
    key = clean_api_key(api_key)
    extra = check_headers(options["headers"])
    tls = tls_settings(options["verify"], http)
    settings_of = (
        AdaptiveConcurrency() if not isinstance(adaptive, AdaptiveConcurrency) else adaptive
    )
    built = []
    for spec in replicas:
        address = parse_address(spec.url, options["default_query"])
        fixed = {"Content-Type": "application/json", "User-Agent": USER_AGENT, **extra}
        if address.basic_auth is not None:
            if key is not None:
                raise ConfigurationError(
                    f"{address.display}: user:password in the URL and api_key would both be "
                    "the Authorization header; give one"
                )
            fixed["Authorization"] = address.basic_auth
        elif key is not None:
            fixed["Authorization"] = f"Bearer {key}"
        proxy_url = resolve_proxy(address.url(""), options["proxy"], options["trust_env"])
        proxy_auth = proxy_authorization(proxy_url)
        if proxy_auth is not None and address.origin.startswith("http://"):
            # a plain-HTTP request is sent to the proxy itself (no CONNECT): the header rides on
            # it, and the proxy removes it before forwarding
            fixed["Proxy-Authorization"], proxy_auth = proxy_auth, None
        redactor = Redactor.of(
            fixed,
            key,
            address.password,
            proxy_url.password if proxy_url else None,
            proxy_auth,
            *address.secrets,
        )
        maximum = spec.max_concurrency or max_concurrency
        initial = settings_of.initial
        try:
            limits = AdaptiveSettings(
                initial=min(16 if initial is None else initial, maximum),
                minimum=min(settings_of.minimum, maximum),
                maximum=maximum,
                increase_ratio=settings_of.increase_ratio,
                decrease_factor=settings_of.decrease_factor,
                cooldown_s=settings_of.cooldown_s,
            )
        except ValueError as exc:
            raise ConfigurationError(f"{address.display}: {exc}") from None
        transport = Transport(
            address,
            fixed,
            redactor,
            ssl=tls,
            proxy=proxy_url,
            proxy_authorization=proxy_auth,
            connect_timeout_s=timeouts.connect_s,
            keepalive_expiry_s=http.keepalive_expiry_s,
            max_response_bytes=http.max_response_bytes,
        )
        rates = RateBuckets(
            spec.rpm or options["rpm"],
            spec.tpm or options["tpm"],
            period_s=rate_limits.period_s,
            initial_output_tokens=rate_limits.initial_output_tokens,
        )
        replica = Replica(address.display, transport, rates, limits, adaptive is not False)
        replica.quota.max_hold_s = options["retry"].retry_after_cap_s
        built.append(replica)
    ejection = options["ejection"]
    probe_timeout_s = timeouts.list_models_s

    async def answers(replica: Replica) -> bool:
        """Whether ``replica`` answers ``GET /models`` with 200 now."""
        resp = await get_models(replica, probe_timeout_s)
        return resp is not None and resp.status == 200

    return Dispatcher(
        built,
        eject_after=ejection.after,
        eject_s=ejection.duration_s,
        probe=answers if ejection.probe_s > 0 else None,
        probe_s=ejection.probe_s,
    )


async def get_models(replica: Replica, timeout_s: float) -> HttpResponse | None:
    """``replica``'s answer to ``GET /models`` (any status; it has then answered), or None when
    it sent none."""
    try:
        resp: HttpResponse = await replica.pool.request("GET", "/models", timeout=timeout_s)
    except (HttpError, HttpTimeout, ResponseTooLarge):
        return None
    replica.answered = True
    return resp
