"""From runs to the report's figures: rates, percentiles, the median run, ratios and targets.

With ``--repeat N`` a mode's row is its run with the median output tokens/s (the lower middle
one for even N), so every figure in a row comes from one real run and they add up
(``output_tokens / wall_s = output_tokens_per_s``); every run's figures stay in the JSON.
Ratios divide the rows' output tokens/s, all measured in the same invocation.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from ._spec import RunFigures

PERCENTILES = (50, 90, 99)
TARGETS_VS_OFFLINE = {"inline": 0.95, "remote": 0.90}
"""Targets: these modes' output tokens/s at least this fraction of ``vllm-offline``'s (the
client's own overhead, whatever the hardware)."""
TARGET_VS_SEQUENTIAL = 10.0
"""Target: inline and remote at least this many times ``sequential``'s output tokens/s (the
batching gain; on a 2-core CPU the engine itself stays below it, see docs/benchmarks.md)."""
PEERS = ("openai-gather", "litellm")


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (the smallest value with at least ``p`` % of the values at or
    below it); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def run_row(figures: RunFigures) -> dict[str, Any]:
    """One run's figures for the report: counts, rates and latency percentiles (the raw
    per-request lists are dropped)."""
    wall = figures.wall_s
    row: dict[str, Any] = {
        "requests": figures.requests,
        "failed": figures.failed,
        "prompt_tokens": figures.prompt_tokens,
        "output_tokens": figures.output_tokens,
        "total_tokens": figures.prompt_tokens + figures.output_tokens,
        "expected_output_tokens": figures.expected_output_tokens,
        "wall_s": wall,
        "requests_per_s": (figures.requests - figures.failed) / wall if wall else 0.0,
        "output_tokens_per_s": figures.output_tokens / wall if wall else 0.0,
        "total_tokens_per_s": (figures.prompt_tokens + figures.output_tokens) / wall
        if wall
        else 0.0,
        "peak_rss_mb": figures.peak_rss_mb,
        "errors": figures.errors,
    }
    for name, values in (("latency", figures.latencies_s), ("ttft", figures.ttfts_s)):
        for p in PERCENTILES:
            row[f"{name}_p{p}_s"] = percentile(values, p)
    return row


@dataclass
class ModeRow:
    """One row of the report: a mode (at one concurrency), its runs and the median run."""

    label: str
    mode: str
    concurrency: int | None
    replicas: int = 1
    runs: list[dict[str, Any]] = field(default_factory=list)
    failed_runs: list[str] = field(default_factory=list)
    skipped: str | None = None
    median: dict[str, Any] | None = None
    vs_sequential: float | None = None
    vs_vllm_offline: float | None = None

    def finish(self) -> None:
        """Pick the median run among the runs that completed."""
        if not self.runs:
            return
        rates = [r["output_tokens_per_s"] for r in self.runs]
        middle = statistics.median_low(rates)
        self.median = dict(self.runs[rates.index(middle)])
        self.median["output_tokens_per_s_runs"] = rates

    @property
    def rate(self) -> float | None:
        return None if self.median is None else float(self.median["output_tokens_per_s"])

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def add_ratios(rows: list[ModeRow]) -> None:
    """Set each row's output tokens/s relative to ``sequential`` and ``vllm-offline``."""
    base = {name: _rate_of(rows, name) for name in ("sequential", "vllm-offline")}
    for row in rows:
        rate = row.rate
        if rate is None:
            continue
        if base["sequential"]:
            row.vs_sequential = rate / base["sequential"]
        if base["vllm-offline"]:
            row.vs_vllm_offline = rate / base["vllm-offline"]


def _rate_of(rows: list[ModeRow], mode: str) -> float | None:
    return next((r.rate for r in rows if r.mode == mode and r.rate), None)


def headline_remote(rows: list[ModeRow], peer_concurrency: int) -> ModeRow | None:
    """The remote row the targets use: the one at the peers' concurrency, else the fastest."""
    remote = [r for r in rows if r.mode == "remote" and r.rate is not None]
    same = [r for r in remote if r.concurrency == peer_concurrency]
    if same:
        return same[0]
    return max(remote, key=lambda r: r.rate or 0.0, default=None)


def targets(rows: list[ModeRow], peer_concurrency: int) -> list[dict[str, Any]]:
    """The targets, each ``{"target", "value", "needed", "met"}``, for the modes that ran
    (``value`` and ``needed`` are ratios of output tokens/s)."""
    out: list[dict[str, Any]] = []
    remote = headline_remote(rows, peer_concurrency)
    inline = next((r for r in rows if r.mode == "inline" and r.rate is not None), None)
    for name, row in (("inline", inline), (remote.label if remote else "remote", remote)):
        if row is None:
            continue
        needed = TARGETS_VS_OFFLINE[row.mode]
        if row.vs_vllm_offline is not None:
            out.append(
                _target(f"{name} >= {needed:.2f} x vllm-offline", row.vs_vllm_offline, needed)
            )
        if row.vs_sequential is not None:
            out.append(
                _target(
                    f"{name} >= {TARGET_VS_SEQUENTIAL:g} x sequential",
                    row.vs_sequential,
                    TARGET_VS_SEQUENTIAL,
                )
            )
    if remote is not None and remote.rate:
        for peer in rows:
            if peer.mode in PEERS and peer.rate:
                out.append(_target(f"{remote.label} >= {peer.label}", remote.rate / peer.rate, 1.0))
    out += engine_targets(rows, inline, remote)
    return out


ENGINE_TARGETS = {"vllm-defaults": 1.30, "remote": 1.05, "vllm-offline": 1.0, "ray": 0.95}
"""Thread binding and engine reuse: ``inline`` at least 1.3x raw ``LLM.chat`` with vLLM's own
binding, 1.05x the same engine behind the server, 1.0x raw ``LLM.chat`` with the same binding;
each ``ray-N`` row at least 0.95x ``inline`` (one engine bound to every core)."""


def engine_targets(
    rows: list[ModeRow], inline: ModeRow | None, remote: ModeRow | None
) -> list[dict[str, Any]]:
    """The :data:`ENGINE_TARGETS` that apply to the rows that ran."""
    if inline is None or not inline.rate:
        return []
    out = []
    for mode in ("vllm-defaults", "vllm-offline"):
        base = next((r for r in rows if r.mode == mode and r.rate), None)
        if base is not None and base.rate:
            needed = ENGINE_TARGETS[mode]
            out.append(_target(f"inline >= {needed:.2f} x {mode}", inline.rate / base.rate, needed))
    if remote is not None and remote.rate:
        needed = ENGINE_TARGETS["remote"]
        out.append(
            _target(f"inline >= {needed:.2f} x {remote.label}", inline.rate / remote.rate, needed)
        )
    for row in rows:
        if row.mode == "ray" and row.rate:
            needed = ENGINE_TARGETS["ray"]
            out.append(
                _target(f"{row.label} >= {needed:.2f} x inline", row.rate / inline.rate, needed)
            )
    return out


def _target(text: str, value: float, needed: float) -> dict[str, Any]:
    return {"target": text, "value": value, "needed": needed, "met": value >= needed}
