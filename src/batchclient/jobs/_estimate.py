"""Dry runs: what a batch file would take, with nothing sent (``client.estimate``,
``batchclient run --dry-run``).

One streamed pass over the file: validation (all of it, as a batch would), the plan of merged
and repeated lines (:mod:`._plan`), result-cache lookups by key in blocks, and prompt tokens
counted in blocks (:mod:`batchclient._core.prompt_tokens`: chat messages, completions prompts
and embeddings inputs alike). Memory stays flat whatever the size of the file.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from anyio import to_thread

from .._core.ledger import Billing, PriceTable, cost_of
from .._core.prefix import chat_prefix
from .._core.prompt_tokens import PromptCounter
from .._core.provider import Provider
from .._core.responses import serves
from ..cache import ResultCache
from ..cache._key import cache_key, canonical_json
from ..errors import ConfigurationError
from ..types import BatchEstimate, Endpoint
from ._plan import LinePlanner
from ._validate import RequestLine, file_endpoint, iter_lines, parse_line, validate_batch_file

_BLOCK = 256
_KNOWN = {e.value for e in Endpoint}  # another url is each line's invalid_url, as in a run


async def estimate_file(
    path: Path,
    provider: Provider | None,
    cache: ResultCache | None,
    *,
    endpoint: str | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
    price_input: float | None = None,
    price_output: float | None = None,
    cache_on: bool | None = None,
    prices: PriceTable | None = None,
) -> BatchEstimate:
    """Estimate the batch file at ``path`` (see :class:`~batchclient.BatchEstimate`).

    ``endpoint`` is the batch's (None: the ``url`` of the file's first line, as ``batchclient
    run`` takes it); every line is validated against it.

    ``provider`` gives the cache identity and, when ``tokenizer`` is None, a local tokenizer
    (``Provider.tokenizer_path``); neither needs the provider started. ``cache`` (None: off or
    empty) is looked up, never written; ``cache_on`` (default: whether ``cache`` is given) is
    what the estimate reports as ``cache``. ``provider.billing(model)`` gives the tier and the
    prompt-cache rule; ``prices``: a price table to cost the tokens by class with. Raises
    ``ConfigurationError`` for a tokenizer that cannot be loaded, or an endpoint the provider
    does not serve (as a run would).
    """
    if endpoint is None:
        endpoint = await to_thread.run_sync(file_endpoint, path)
    served = sorted(e.value for e in serves(provider)) if provider is not None else []
    if provider is not None and endpoint in _KNOWN and endpoint not in served:
        raise ConfigurationError(
            f"endpoint {str(endpoint)!r} is not served by {type(provider).__name__}; "
            f"supported: {', '.join(served)}"
        )
    model = await to_thread.run_sync(_first_model, path)
    identity = None
    if model is not None and provider is not None:
        if cache is not None:
            identity = canonical_json(await provider.cache_identity(model))
        if tokenizer is None:
            tokenizer = await provider.tokenizer_path(model)
    counter = await to_thread.run_sync(PromptCounter, tokenizer)
    billing = provider.billing(model) if provider is not None and model is not None else Billing()
    est = await to_thread.run_sync(
        _estimate, path, endpoint, counter, cache, identity, price_input, price_output, billing
    )
    if cache_on is not None:
        est.cache = cache_on
    if prices is not None and model is not None and est.ok:
        est.cost = cost_of(
            prices, model, billing.tier,
            input_tokens=est.prompt_tokens, cached_tokens=est.cached_input_tokens,
            cache_write_tokens=est.cache_write_tokens, output_tokens=est.max_output_tokens,
        )  # fmt: skip
    return est


def _first_model(path: Path) -> str | None:
    with path.open("rb") as f:
        for _, raw in iter_lines(f):
            if raw is None or not raw.strip():
                continue
            obj, _ = parse_line(raw)
            body = obj.get("body") if obj else None
            model = body.get("model") if isinstance(body, dict) else None
            return model if isinstance(model, str) else None
    return None


def _estimate(
    path: Path,
    endpoint: str,
    counter: PromptCounter,
    cache: ResultCache | None,
    identity: bytes | None,
    price_input: float | None,
    price_output: float | None,
    billing: Billing,
) -> BatchEstimate:
    est = BatchEstimate(cache=cache is not None, tier=billing.tier)
    block: list[tuple[str | None, dict[str, Any]]] = []
    prefixes = _SharedPrefixes(counter, billing)

    def flush() -> None:
        if cache is not None and identity is not None:
            keys = [k for k, _ in block if k is not None]
            hits = cache.contains(keys) if keys else set()
            est.cache_hits += len(hits)
            bodies = [b for k, b in block if k not in hits]
        else:
            bodies = [b for _, b in block]
        block.clear()
        est.to_send += len(bodies)
        est.prompt_tokens += sum(counter.count(bodies)) if bodies else 0
        prefixes.add(bodies)
        for body in bodies:
            cap = body.get("max_completion_tokens", body.get("max_tokens"))
            if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
                est.max_output_tokens += cap
            else:
                est.without_max_tokens += 1

    with LinePlanner(endpoint) as planner:

        def on_request(line: RequestLine) -> None:
            plan = planner.add(line.seq, line.body)
            if plan.same_as is not None:
                return
            key = None if identity is None else cache_key(plan.digest, identity, plan.repeat)
            block.append((key, line.body))
            if len(block) >= _BLOCK:
                flush()

        with path.open("rb") as f:
            report = validate_batch_file(f, endpoint=endpoint, on_request=on_request)
        flush()
        est.merged = planner.merged
    est.requests = report.total
    if not report.ok:
        return BatchEstimate(requests=report.total, errors=report.errors, cache=est.cache)
    est.cached_input_tokens, est.cache_write_tokens = prefixes.totals()
    est.tokenizer = counter.name
    est.prompt_tokens_estimated = counter.estimated
    if price_input is not None or price_output is not None:
        est.price_input, est.price_output = price_input, price_output
        est.input_cost_usd = est.prompt_tokens * (price_input or 0.0) / 1e6
        est.output_cost_usd = est.max_output_tokens * (price_output or 0.0) / 1e6
        est.cost_usd = est.input_cost_usd + est.output_cost_usd
    return est


class _SharedPrefixes:
    """The chat prefixes (every message but the last) of the requests to send, by digest, with
    how many requests have each and its token count (counted once per distinct prefix), for
    the input a prompt cache would read (every request of a shared prefix but the first) and
    write (the first, where writes are billed apart) under the provider's rule."""

    def __init__(self, counter: PromptCounter, billing: Billing) -> None:
        self.counter, self.billing = counter, billing
        self.seen: dict[bytes, list[int]] = {}  # digest -> [requests, tokens]

    def add(self, bodies: list[dict[str, Any]]) -> None:
        if self.billing.cache_min_tokens is None:
            return
        for body in bodies:
            data = chat_prefix(body)
            if data is None:
                continue
            digest = hashlib.blake2b(data, digest_size=16).digest()
            entry = self.seen.get(digest)
            if entry is None:
                tokens = self.counter.count([{**body, "messages": body["messages"][:-1]}])[0]
                self.seen[digest] = [1, tokens]
            else:
                entry[0] += 1

    def totals(self) -> tuple[int, int]:
        """(cached input tokens, cache-write tokens) over every shared prefix long enough."""
        least, sharing = self.billing.cache_min_tokens, max(2, self.billing.cache_min_requests)
        cached = written = 0
        for requests, tokens in self.seen.values():
            if least is not None and requests >= sharing and tokens >= least:
                cached += (requests - 1) * tokens
                written += tokens if self.billing.cache_writes else 0
        return cached, written


def describe(est: BatchEstimate) -> list[str]:
    """The dry run's report as lines of text (what ``batchclient run --dry-run`` prints)."""
    if not est.ok:
        lines = [f"dry run: the file would be refused ({len(est.errors)} error(s)); nothing sent"]
        for error in est.errors[:20]:
            where = f"line {error.line}: " if error.line else ""
            param = f" ({error.param})" if error.param else ""
            lines.append(f"  {where}{error.code}{param}: {error.message}")
        return lines
    cache = (
        f"{est.cache_hits:,} answered by the result cache"
        if est.cache
        else "result cache off (--cache to use it)"
    )
    how = (
        f"counted with the tokenizer {est.tokenizer}"
        if not est.prompt_tokens_estimated
        else "estimated, about 4 characters per token; --tokenizer DIR counts them exactly"
    )
    if est.tokenizer and est.prompt_tokens_estimated:
        how = f"counted with {est.tokenizer}, some estimated (templates that failed)"
    caps = "every request sets max_tokens"
    if est.without_max_tokens:
        caps = (
            f"{est.without_max_tokens:,} without max_tokens, counted as 0: bounded by the context"
        )
    lines = [
        "dry run: nothing was sent",
        f"requests:          {est.requests:,} lines; {est.to_send:,} to send "
        f"({est.merged:,} identical greedy lines merged; {cache})",
        f"prompt tokens:     {est.prompt_tokens:,} ({how})",
        f"  of which cached: {est.cached_input_tokens:,} read from the prompt cache, "
        f"{est.cache_write_tokens:,} written to it, "
        f"{est.prompt_tokens - est.cached_input_tokens - est.cache_write_tokens:,} uncached "
        f"({est.tier} tier)",
        f"max output tokens: {est.max_output_tokens:,} ({caps})",
    ]
    if est.cost is not None:
        c = est.cost
        lines.append(
            f"cost ({c.currency}):        {c.total:,.4f} at most at the prices of {c.as_of} "
            f"({c.model}, {c.tier}): uncached input {c.input:,.4f}, cached input "
            f"{c.cached_input:,.4f}, cache writes {c.cache_write:,.4f}, output {c.output:,.4f}"
        )
    if est.cost_usd is not None:
        lines.append(
            f"cost:              ${est.cost_usd:,.4f} at most (input ${est.input_cost_usd:,.4f} "
            f"at ${est.price_input or 0:g}/M, output ${est.output_cost_usd:,.4f} at "
            f"${est.price_output or 0:g}/M tokens)"
        )
    return lines
