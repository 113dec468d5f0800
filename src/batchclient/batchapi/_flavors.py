"""The OpenAI-shaped Batch APIs that differ from OpenAI's in small ways, normalised in one place.

:class:`~._openai.OpenAIBackend` speaks OpenAI's Files + Batch shape; a *flavour* (``openai``,
also any server that copies it; ``together``; ``groq``; ``mistral``) says how one provider
departs from it, as data (:data:`FLAVORS`) and the functions at the edges of the wire
(:func:`create_body`, :func:`list_params` out; :func:`normalize`, :func:`read_page` in), so the
runner only ever sees OpenAI's ``Batch`` object. ``docs/batch-api.md`` ("The flavours side by
side", "What was checked, and what is assumed") lists each departure and its source.

A status no table knows is read as ``in_progress`` (logged once per status): the batch keeps
being polled, and the local job's window bounds the wait; an unknown word never ends a batch
early or crashes the client.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel

from ..errors import ConfigurationError
from ..jobs._runner import parse_window
from ..types import BatchStatus

__all__ = [
    "FLAVORS",
    "PRICE_NOTES",
    "Flavor",
    "FlavorSpec",
    "RemoteBatch",
    "check_window",
    "detect_flavor",
    "flavor_of",
]

log = logging.getLogger("batchclient.batchapi")

Flavor = Literal["openai", "together", "groq", "mistral"]

_DAY = 86400.0


@dataclass(frozen=True)
class FlavorSpec:
    """What one flavour needs: where its calls go and how its answers read.

    ``max_lines`` / ``max_bytes``: its limits for one batch input file (the client's defaults).
    ``windows``: the shortest and longest ``completion_window`` in seconds it accepts (None:
    any; ``openai``'s hold on OpenAI's own host only). ``metadata``: its batches keep labels.
    ``needs_model``: a create names the model.
    """

    name: Flavor
    hosts: tuple[str, ...]
    purpose: str
    batches: str
    max_lines: int
    max_bytes: int
    windows: tuple[float, float] | None
    statuses: Mapping[str, str]
    metadata: bool = True
    needs_model: bool = False


_OPENAI_STATUSES = {
    s: s
    for s in (
        "validating", "in_progress", "finalizing", "completed", "failed", "cancelling",
        "cancelled", "expired",
    )
}  # fmt: skip

FLAVORS: dict[str, FlavorSpec] = {
    "openai": FlavorSpec(
        "openai", ("api.openai.com",), "batch", "/batches", 50_000, 200 * 1024 * 1024,
        (_DAY, _DAY), _OPENAI_STATUSES,
    ),
    "together": FlavorSpec(
        "together", ("api.together.xyz", "api.together.ai"), "batch-api", "/batches",
        50_000, 100 * 1024 * 1024, (_DAY, _DAY),
        {
            "VALIDATING": "validating", "IN_PROGRESS": "in_progress", "COMPLETED": "completed",
            "FAILED": "failed", "EXPIRED": "expired", "CANCELLED": "cancelled",
            "CANCELLING": "cancelling",
        },
        metadata=False,
    ),
    "groq": FlavorSpec(
        "groq", ("api.groq.com",), "batch", "/batches", 50_000, 100 * 1024 * 1024,
        (_DAY, 7 * _DAY), _OPENAI_STATUSES,
    ),
    "mistral": FlavorSpec(
        "mistral", ("api.mistral.ai",), "batch", "/batch/jobs", 50_000, 100 * 1024 * 1024,
        (3600.0, 7 * _DAY),
        {
            "QUEUED": "validating", "RUNNING": "in_progress", "SUCCESS": "completed",
            "FAILED": "failed", "TIMEOUT_EXCEEDED": "expired",
            "CANCELLATION_REQUESTED": "cancelling", "CANCELLED": "cancelled",
        },
        needs_model=True,
    ),
}  # fmt: skip
"""Every flavour by name."""


PRICE_NOTES: dict[str, str] = {
    "openai": "OpenAI: half the list price",
    "together": "Together: up to 50% off serverless rates, on the models it lists",
    "groq": "Groq: 25% off on-demand prices, per its batch guide",
    "mistral": "Mistral: half the list price, as announced",
    "anthropic-batch": "Anthropic Message Batches: half the list price",
    "gemini-batch": "Gemini Batch API: half the live price",
}
"""What each provider (a flavour, or ``--provider`` for Anthropic and Gemini) says its
batch discount is, for the dry run (check the current price list: discounts change)."""


def detect_flavor(base_url: str) -> Flavor:
    """The flavour a base URL's host names (``api.together.xyz`` -> ``together``, ...);
    ``openai`` for any other host."""
    host = (urlsplit(base_url).hostname or "").lower()
    for spec in FLAVORS.values():
        if host in spec.hosts:
            return spec.name
    return "openai"


def flavor_of(flavor: str | None, base_url: str) -> FlavorSpec:
    """The flavour given (checked), or the one the base URL names when None.

    Raises:
        ConfigurationError: an unknown flavour name.
    """
    if flavor is None:
        return FLAVORS[detect_flavor(base_url)]
    spec = FLAVORS.get(flavor.lower())
    if spec is None:
        raise ConfigurationError(
            f"unknown flavor {flavor!r}: the flavors are {', '.join(get_args(Flavor))}"
        )
    return spec


def check_window(spec: FlavorSpec, window: str, base_url: str) -> float:
    """``window`` in seconds, if the flavour accepts it.

    Raises:
        ConfigurationError: a window that is not ``<number><s|m|h|d>``, or one the flavour
            refuses (OpenAI's own host: only 24 h; Together: only 24 h; Groq: 24 h to 7 d;
            Mistral: whole hours up to 7 d).
    """
    try:
        seconds = parse_window(window)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    bounds = spec.windows
    if spec.name == "openai" and (urlsplit(base_url).hostname or "").lower() not in spec.hosts:
        bounds = None  # another server shaped like OpenAI's: its own rules
    if bounds is not None and not bounds[0] <= seconds <= bounds[1]:
        low, high = (_span(b) for b in bounds)
        allowed = f"only {low}" if low == high else f"from {low} to {high}"
        raise ConfigurationError(f"completion_window {window!r}: {spec.name} accepts {allowed}")
    if spec.name == "mistral" and seconds % 3600:
        raise ConfigurationError(
            f"completion_window {window!r}: mistral takes whole hours (timeout_hours)"
        )
    return seconds


def _span(seconds: float) -> str:
    if seconds >= _DAY and seconds % _DAY == 0:
        return f"{seconds / _DAY:g}d"
    return f"{seconds / 3600:g}h"


# ---------------------------------------------------------------------- requests


def create_body(
    spec: FlavorSpec,
    input_file_id: str,
    endpoint: str,
    window: str,
    metadata: dict[str, str],
    model: str | None,
) -> dict[str, Any]:
    """The JSON body of a create in the flavour's words."""
    if spec.name == "mistral":
        body: dict[str, Any] = {
            "input_files": [input_file_id],
            "endpoint": endpoint,
            "model": model,
            "metadata": metadata,
            "timeout_hours": max(1, round(parse_window(window) / 3600)),
        }
        return body
    body = {"input_file_id": input_file_id, "endpoint": endpoint, "completion_window": window}
    if spec.metadata:
        body["metadata"] = metadata
    return body


def list_params(spec: FlavorSpec, cursor: str | None, page_size: int) -> dict[str, str]:
    """The query of one ``GET`` of the batch list (``cursor``: what :func:`read_page` gave)."""
    if spec.name == "mistral":
        return {"page": cursor or "0", "page_size": str(page_size)}
    if spec.name == "together":
        return {}
    return {"limit": str(page_size), **({"after": cursor} if cursor else {})}


def read_page(
    spec: FlavorSpec, page: object, cursor: str | None, page_size: int
) -> tuple[list[Any], str | None]:
    """A list answer's entries and the cursor of the next page (None: this was the last)."""
    if isinstance(page, list):  # Together: the whole list, unpaged
        return page, None
    if not isinstance(page, dict):  # (a bare array arrives wrapped as {"data": [...]})
        return [], None
    entries = page.get("data")
    if not isinstance(entries, list) or not entries:
        return [], None
    if spec.name == "mistral":
        number = int(cursor or "0")
        total = page.get("total")
        more = isinstance(total, int) and (number + 1) * page_size < total
        return entries, str(number + 1) if more else None
    if not page.get("has_more"):
        return entries, None
    last = page.get("last_id")
    if not isinstance(last, str) or not last:
        tail = entries[-1]
        last = str(tail.get("id")) if isinstance(tail, dict) and tail.get("id") else None
    return entries, last


# ---------------------------------------------------------------------- answers


class RemoteError(BaseModel):
    """One entry of a remote batch's ``errors.data`` (validation errors; ``line`` 1-based)."""

    code: str | None = None
    message: str | None = None
    line: int | None = None
    param: str | None = None


class RemoteErrors(BaseModel):
    data: list[RemoteError] = []


class RemoteCounts(BaseModel):
    completed: int = 0
    failed: int = 0


class RemoteBatch(BaseModel):
    """The fields of OpenAI's ``Batch`` object this client reads (others are ignored), as
    :func:`normalize` gives any flavour's."""

    id: str
    status: BatchStatus
    input_file_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: RemoteErrors | None = None
    request_counts: RemoteCounts | None = None
    metadata: dict[str, Any] | None = None


def normalize(spec: FlavorSpec, data: dict[str, Any]) -> dict[str, Any]:
    """A flavour's batch object as OpenAI's ``Batch`` (a new dict; ``data`` is not changed)."""
    if spec.name == "together" and isinstance(data.get("job"), dict):
        if data.get("warning"):
            log.warning("together: %s", str(data["warning"])[:300])
        data = data["job"]
    out = dict(data)
    for key, value in data.items():
        if key.endswith(("_at", "_deadline")) and isinstance(value, str):
            out[key] = _epoch(value)
    out["status"] = status_of(spec, data.get("status"))
    if spec.name == "together":
        if "job_deadline" in out and "expires_at" not in out:
            out["expires_at"] = out["job_deadline"]
        if isinstance(data.get("error"), str) and data["error"]:
            out["errors"] = {"data": [{"code": "batch_failed", "message": data["error"]}]}
    elif spec.name == "mistral":
        files = data.get("input_files")
        if isinstance(files, list) and files:
            out["input_file_id"] = str(files[0])
        out["output_file_id"] = data.get("output_file")
        out["error_file_id"] = data.get("error_file")
        out["request_counts"] = {
            "total": _int(data.get("total_requests")),
            "completed": _int(data.get("succeeded_requests")),
            "failed": _int(data.get("failed_requests")),
        }
        errors = data.get("errors")
        if isinstance(errors, list):
            out["errors"] = {
                "data": [
                    {"code": "batch_failed", "message": str(e.get("message"))}
                    for e in errors
                    if isinstance(e, dict)
                ]
            }
    return out


_warned: set[tuple[str, str]] = set()


def status_of(spec: FlavorSpec, status: object) -> str:
    """A flavour's status word as OpenAI's; an unknown one is ``in_progress`` (logged once):
    polling goes on and the local window bounds the wait."""
    text = str(status)
    known = spec.statuses.get(text) or spec.statuses.get(text.upper())
    if known is None and text.lower() in _OPENAI_STATUSES:
        known = text.lower()
    if known is None:
        if (spec.name, text) not in _warned:
            _warned.add((spec.name, text))
            log.warning(
                "%s: unknown batch status %r, read as in_progress (polling goes on)",
                spec.name,
                text,
            )
        return "in_progress"
    return known


def _epoch(text: str) -> int | None:
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return None


def _int(value: object) -> int:
    return value if isinstance(value, int) and value >= 0 else 0
