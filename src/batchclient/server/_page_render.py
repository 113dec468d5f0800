"""The HTML of the status page and its sign-in form: plain server-rendered HTML, no script,
refreshed by ``<meta http-equiv="refresh">``. Every value that comes from a tenant (batch
metadata, ``custom_id``s, error messages) or from the upstream is escaped with
:func:`html.escape`; nothing is put in an attribute without it."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from html import escape

from ..types import Batch, BatchItemError

REFRESH_S = 5
"""Seconds between the page's own reloads."""

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0 .6em 0 0;display:inline}
header{display:flex;flex-wrap:wrap;align-items:center;gap:.3em 1em;margin-bottom:1em}
header form{margin-left:auto}
#tenant{overflow-wrap:anywhere;min-width:min(100%,20em)}
table{border-collapse:collapse;width:100%}
th,td{border-bottom:1px solid #ddd;padding:.35em .5em;text-align:left;vertical-align:top}
th{background:#f4f4f4}
progress{width:10em}
.num{font-variant-numeric:tabular-nums;white-space:nowrap}
.status-completed{color:#176317}.status-failed,.status-expired{color:#a11}
.status-cancelled,.status-cancelling{color:#775}
tr.batch-errors td{border-top:0;padding-top:0}
.errors{margin:0;padding-left:1.2em;color:#a11;font-size:.9em;overflow-wrap:anywhere}
.id{white-space:nowrap}
.meta{font-size:.9em;color:#555;overflow-wrap:anywhere}
.empty{color:#777}.problem{color:#a11}
@media (max-width:40em){
body{margin:.8em}
thead{display:none}
table,tbody,tr,td{display:block}
tr.batch{border-top:2px solid #ccc;padding:.3em 0}
tr.batch td{border:0;padding:.1em .3em;white-space:normal}
td[data-label]::before{content:attr(data-label) ": ";color:#555}
progress{width:50%}
}
"""


@dataclass(frozen=True)
class LineError:
    """A failed line of a batch, as the page shows it."""

    custom_id: str
    error: BatchItemError | None


@dataclass(frozen=True)
class Capacity:
    """The tenant's share of the provider now: slots held, requests waiting, the capacity."""

    in_flight: int
    waiting: int
    capacity: int


def _document(title: str, body: str, refresh: bool) -> str:
    meta = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{meta}<title>{escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>"
    )


def sign_in_page(problem: str | None = None) -> str:
    """The sign-in form: the key is POSTed in the body to ``signin`` (relative: the app may be
    mounted under a prefix), never put in a URL."""
    note = f'<p class="problem" role="alert">{escape(problem)}</p>' if problem else ""
    body = (
        "<header><h1>batchclient</h1></header>"
        f"{note}"
        '<form method="post" action="signin" id="signin">'
        '<label>API key <input type="password" name="key" autocomplete="current-password" '
        'required autofocus></label> <button type="submit">Sign in</button></form>'
    )
    return _document("batchclient: sign in", body, refresh=False)


def status_page(
    tenant: str,
    batches: list[Batch],
    errors: dict[str, list[LineError]],
    capacity: Capacity,
    *,
    signed_in: bool,
    unrun: Mapping[str, int] | None = None,
    now: float | None = None,
) -> str:
    """The tenant's batches (newest first) with progress, counts, throughput, ETA, and under
    each its validation errors and first failed lines. ``unrun``: by batch id, the lines a
    cancelled or expired batch never ran (failed with ``batch_cancelled`` / ``batch_expired``):
    its progress shows what was done. Below 40em wide each batch is a block of labelled
    lines instead of a table row."""
    unrun = unrun or {}
    now = time.time() if now is None else now
    sign_out = (
        '<form method="post" action="signout"><button type="submit">Sign out</button></form>'
        if signed_in
        else ""
    )
    header = (
        f'<header><h1>batchclient</h1><span class="meta" id="tenant">tenant {escape(tenant)}</span>'
        f'<span class="num" id="capacity">in flight {capacity.in_flight}, waiting '
        f"{capacity.waiting} (server capacity {capacity.capacity})</span>{sign_out}</header>"
    )
    if not batches:
        table = '<p class="empty" id="no-batches">No batches yet.</p>'
    else:
        rows = "".join(_row(b, errors.get(b.id, []), unrun.get(b.id, 0), now) for b in batches)
        table = (
            '<table id="batches"><thead><tr><th>Batch</th><th>Status</th><th>Progress</th>'
            "<th>Completed / failed / total</th><th>Throughput</th><th>ETA</th>"
            "<th>Tokens in (cached) / out</th><th>Metadata</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
        )
    footer = f'<p class="meta">Refreshes every {REFRESH_S} s.</p>'
    return _document("batchclient: batches", header + table + footer, refresh=True)


def _row(batch: Batch, errors: list[LineError], unrun: int, now: float) -> str:
    counts = batch.request_counts
    unrun = min(unrun, counts.failed)
    failed = counts.failed - unrun  # lines that ran and failed
    done = counts.completed + failed
    total = counts.total
    percent = 100.0 * done / total if total else 0.0
    not_run = f", {unrun} not run ({batch.status})" if unrun else ""
    rate, eta = progress_figures(batch, now)
    status = batch.status
    problems = [
        f"line {e.line}: {e.code}: {e.message}" if e.line else f"{e.code}: {e.message}"
        for e in (batch.errors.data if batch.errors else [])
    ] + [
        f"{e.custom_id}: {e.error.code}: {e.error.message}" if e.error else e.custom_id
        for e in errors
    ]
    error_row = (
        f'<tr class="batch-errors" data-batch="{escape(batch.id)}"><td colspan="8">'
        '<ul class="errors">'
        + "".join(f"<li>{escape(_clip(p))}</li>" for p in problems[:5])
        + "</ul></td></tr>"
        if problems
        else ""
    )
    metadata = json.dumps(batch.metadata, ensure_ascii=False) if batch.metadata else ""
    return (
        f'<tr class="batch" id="{escape(batch.id)}" data-status="{escape(status)}">'
        f'<td class="meta id">{escape(batch.id)}<br>{escape(batch.model or "")}</td>'
        f'<td class="status-{escape(status)}" data-label="Status">{escape(status)}</td>'
        f'<td data-label="Progress"><progress max="{max(total, 1)}" value="{done}"></progress> '
        f'<span class="num percent">{percent:.0f}%</span></td>'
        f'<td class="num counts" data-label="Completed / failed / total">{counts.completed} / '
        f"{failed} / {total}{not_run}</td>"
        f'<td class="num rate" data-label="Throughput">{_rate(rate)}</td>'
        f'<td class="num eta" data-label="ETA">{_duration(eta)}</td>'
        f'<td class="num tokens" data-label="Tokens in (cached) / out">{_tokens(batch)}</td>'
        f'<td class="meta metadata" data-label="Metadata">{escape(_clip(metadata))}</td></tr>'
        f"{error_row}"
    )


def _tokens(batch: Batch) -> str:
    """``input (cached) / output`` tokens of the batch's answers so far; the cached ones are
    the input read from a prompt cache (``usage.input_tokens_details.cached_tokens``)."""
    usage = batch.usage
    cached = usage.input_tokens_details.cached_tokens
    return f"{usage.input_tokens:,} ({cached:,}) / {usage.output_tokens:,}"


def progress_figures(batch: Batch, now: float) -> tuple[float | None, float | None]:
    """While the batch runs (``in_progress``, ``finalizing``): lines finished per second and
    the seconds left at that rate, its own estimate (``Batch.progress``: the rate smoothed in
    time) when it has one, else the average since ``in_progress_at``; None when unknown. A
    batch that is not running has neither (a cancelled one's lines filled as not run would
    read as a rate)."""
    if batch.status not in ("in_progress", "finalizing"):
        return None, None
    if batch.progress is not None and batch.progress.requests_per_s is not None:
        return batch.progress.requests_per_s, batch.progress.eta_s
    started = batch.in_progress_at
    counts = batch.request_counts
    done = counts.completed + counts.failed
    if started is None or done == 0:
        return None, None
    rate = done / max(now - started, 1.0)
    return rate, max(counts.total - done, 0) / rate


def _rate(rate: float | None) -> str:
    return "&ndash;" if rate is None else f"{rate:,.1f} lines/s"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "&ndash;"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
