"""``batchclient run``: one OpenAI batch file through a provider, with a live progress bar, durable
and resumable. The batch's endpoint (``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``) is the ``url`` of the file's first line; every line must use it (OpenAI's
rule: one endpoint per file).

Resume key: the SHA-256 of the input's bytes plus the provider's identity (remote: base URL;
vllm and ray: the model), content and configuration only (curator #143 keyed on in-memory
fingerprints), kept in the job's metadata as ``batchclient_run``. Running the same command again

- attaches to the job if it is still active (this client resumed it on entry);
- sends nothing if it completed, and rebuilds the output files (lm-evaluation-harness #2141);
- resumes it if it failed after validation (its files could not be written, its state
  directory failed under it): only requests without a result are sent, then the files are
  written;
- otherwise (cancelled, expired, refused at validation) starts a new job that reuses every
  successful result of the previous one, so only what did not succeed is sent again.

``--dry-run`` sends nothing: it validates the file and prints what a run would take
(:func:`batchclient.jobs.estimate_file`). ``--cache`` runs the job behind the result cache.

Guide: ``docs/jobs.md`` ("The CLI").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from .. import _registry as registry
from .._core.client import BatchClient
from .._core.ledger import PriceTable, cost_of
from .._core.provider import Provider
from .._state import exists
from ..batchapi._flavors import PRICE_NOTES
from ..errors import ConfigurationError
from ..jobs import JobManager
from ..jobs._estimate import describe, estimate_file
from ..jobs._runner import WriteRetry
from ..jobs._validate import file_endpoint
from ..types import Batch, BatchStatus
from ._providers import add_provider_arguments
from ._providers import make_client as make_registry_client

RUN_KEY = "batchclient_run"
COMPLETION_WINDOW = "24h"
"""A job's completion window when ``--completion-window`` is not given."""


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, help="OpenAI batch input file (JSONL)")
    p.add_argument(
        "-o", "--output", type=Path, default=None, help="output file (JSONL; not with --dry-run)"
    )
    p.add_argument(
        "--errors",
        type=Path,
        default=None,
        help="write failed lines here (default: every line goes to --output, as vllm run-batch)",
    )
    add_provider_arguments(p, api_key_flag="--api-key", batch_api=True)
    p.add_argument(
        "--completion-window",
        default=None,
        help=f"how long the job may run, e.g. 24h, 30m (default {COMPLETION_WINDOW}; batch-api: "
        "also its remote batches' completion window)",
    )
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    dry = p.add_argument_group("dry run")
    dry.add_argument(
        "--dry-run",
        action="store_true",
        help="validate and print requests, cache hits, prompt and max output tokens and cost; "
        "send nothing",
    )
    dry.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="count prompt tokens with this tokenizer (default: the model's when it is local, "
        "else an estimate)",
    )
    dry.add_argument(
        "--price-input",
        type=float,
        default=None,
        metavar="USD",
        help="USD per million input tokens",
    )
    dry.add_argument(
        "--price-output",
        type=float,
        default=None,
        metavar="USD",
        help="USD per million output tokens",
    )
    dry.add_argument(
        "--prices",
        type=Path,
        default=None,
        metavar="FILE",
        help="a price table (JSON: per model and tier, per million input, cached input, cache "
        "write and output tokens; docs/batch-api.md, 'What it costs'): the dry run's cost, and "
        "a finished run's",
    )


def _check_paths(args: argparse.Namespace) -> None:
    """Never write over the input, or errors over the output (vllm PR #52505: an output path
    equal to the input path truncated the input)."""
    inp: Path = args.input
    if not inp.is_file():
        raise ConfigurationError(f"input {inp} is not a file")
    if args.dry_run:
        return
    if args.output is None:
        raise ConfigurationError("-o/--output is required (except with --dry-run)")
    outputs = [("--output", args.output)] + ([("--errors", args.errors)] if args.errors else [])
    for flag, path in outputs:
        if _same(path, inp):
            raise ConfigurationError(f"{flag} {path} is the input file: refusing to overwrite it")
    if args.errors is not None and _same(args.errors, args.output):
        raise ConfigurationError("--errors and --output are the same file")


def _same(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def make_client(args: argparse.Namespace) -> BatchClient:
    """The client ``run`` uses: the registry's client of ``--provider`` with ``--state-dir``,
    ``--cache`` and, for a provider that takes it, ``--completion-window`` when given."""
    extra = {}
    window = args.completion_window
    if window is not None and "completion_window" in registry.entry_of(args.provider).option_names:
        extra["completion_window"] = window
    return make_registry_client(args, **extra)


def run_command(args: argparse.Namespace) -> int:
    _check_paths(args)
    prices = PriceTable.load(args.prices) if args.prices is not None else None
    client = make_client(args)
    if args.dry_run:
        return _dry_run(client, args, prices)
    console = Console(stderr=True)
    job, written = anyio.run(_run, client, args, console)
    counts, usage = job.request_counts, job.usage
    hits = f"; {job.cache_hits} from the cache" if args.cache or job.cache_hits else ""
    print(
        f"{job.id}: {job.status}; {counts.completed} completed, {counts.failed} failed of "
        f"{counts.total}{hits}; {usage.input_tokens} input / {usage.output_tokens} output tokens"
    )
    for line in ledger_lines(job, client.provider, prices):
        print(line)
    if job.status == "failed":
        for error in (job.errors.data if job.errors else [])[:20]:
            where = f"line {error.line}: " if error.line else ""
            param = f" ({error.param})" if error.param else ""
            print(f"  {where}{error.code}{param}: {error.message}", file=sys.stderr)
        if _all_results(job) and written is None:
            print(f"output (every result, written all the same): {args.output}")
        if job.in_progress_at is not None:
            print(
                "  every finished result is kept in the state directory: run the same command "
                "again to finish the job",
                file=sys.stderr,
            )
        return 1
    if written is not None:
        print(f"batchclient: {written}", file=sys.stderr)
        return 1
    print(f"output: {args.output}" + (f"; errors: {args.errors}" if args.errors else ""))
    return 0 if job.status == "completed" else 1


def ledger_lines(job: Batch, provider: Provider, prices: PriceTable | None) -> list[str]:
    """A finished run's tokens by class and, with ``prices``, what they cost."""
    usage = job.usage
    details = usage.input_tokens_details
    tier = provider.billing(job.model).tier if job.model else "standard"
    lines = [
        f"  tokens ({tier} tier): input {usage.input_tokens:,} of which {details.cached_tokens:,} "
        f"read from the prompt cache and {details.cache_write_tokens:,} written to it; output "
        f"{usage.output_tokens:,} of which {usage.output_tokens_details.reasoning_tokens:,} "
        "reasoning"
    ]
    if prices is not None and job.model:
        cost = cost_of(
            prices, job.model, tier,
            input_tokens=usage.input_tokens, cached_tokens=details.cached_tokens,
            cache_write_tokens=details.cache_write_tokens, output_tokens=usage.output_tokens,
        )  # fmt: skip
        if cost is None:
            lines.append(f"  cost: the price table has no {tier} price for {job.model}")
        else:
            lines.append(
                f"  cost ({cost.currency}, prices of {cost.as_of}): {cost.total:,.4f} (uncached "
                f"input {cost.input:,.4f}, cached input {cost.cached_input:,.4f}, cache writes "
                f"{cost.cache_write:,.4f}, output {cost.output:,.4f})"
            )
    return lines


def _dry_run(client: BatchClient, args: argparse.Namespace, prices: PriceTable | None) -> int:
    """``--dry-run``: nothing is sent and no engine is started (the provider is not entered;
    the remote one may ask ``GET /models`` for the model's identity and tokenizer)."""

    async def go() -> Any:
        cache = None
        manager = JobManager(client.state_dir)
        async with manager:
            if args.cache and exists(client.state_dir / "batchclient.sqlite3"):
                cache = await manager.result_cache()
            try:
                return await estimate_file(
                    args.input,
                    client.provider,
                    cache,
                    tokenizer=args.tokenizer,
                    price_input=args.price_input,
                    price_output=args.price_output,
                    cache_on=args.cache,
                    prices=prices,
                )
            finally:
                await client.provider.stop()

    estimate = anyio.run(go)
    for line in describe(estimate):
        print(line)
    if prices is not None and estimate.ok and estimate.cost is None:
        print(f"cost:              the price table has no {estimate.tier} price for this model")
    flavor = getattr(client.provider, "flavor", None)
    if not isinstance(flavor, str) and args.provider in PRICE_NOTES:
        flavor = args.provider
    if estimate.cost_usd is not None and isinstance(flavor, str):
        note = PRICE_NOTES[flavor]
        print(f"batch price:       the prices given, as {flavor}'s batch prices ({note})")
    return 0 if estimate.ok else 1


async def _run(
    client: BatchClient, args: argparse.Namespace, console: Console
) -> tuple[Batch, str | None]:
    """Run (or attach to, resume, rebuild) the job; return it and, when the output could not
    be written, why."""
    async with client:
        sha = await anyio.to_thread.run_sync(_sha256, args.input)
        identity = json.dumps(client.provider.identity(), sort_keys=True)
        key = hashlib.sha256(f"{sha}\n{identity}".encode()).hexdigest()[:40]
        previous = [
            j for j in await client.batches.list() if (j.metadata or {}).get(RUN_KEY) == key
        ]
        latest = previous[0] if previous else None
        if latest is not None and latest.status in BatchStatus.ACTIVE:
            if not client.batches.running_here(latest.id):
                raise ConfigurationError(
                    f"job {latest.id} for this input is being run by another process "
                    "(see `batchclient jobs status`)"
                )
            job_id = latest.id
            console.print(f"resuming job {job_id}")
        elif latest is not None and latest.status == "completed":
            job_id = latest.id
            console.print(f"job {job_id} already completed: nothing to send, rebuilding outputs")
        elif latest is not None and latest.status == "failed" and latest.in_progress_at:
            job_id = (await client.batches.resume(latest.id)).id
            console.print(
                f"resuming job {job_id}, which failed after validation: only requests without "
                "a result are sent"
            )
        else:
            reuse = latest.id if latest is not None and latest.status != "failed" else None
            record = await client.files.create(args.input)
            endpoint = await anyio.to_thread.run_sync(file_endpoint, args.input)
            job_id = (
                await client.batches.create(
                    record.id,
                    endpoint=endpoint,
                    completion_window=args.completion_window or COMPLETION_WINDOW,
                    metadata={RUN_KEY: key},
                    reuse_results_from=reuse,
                )
            ).id
            note = f", reusing the successful results of {reuse}" if reuse else ""
            console.print(f"started job {job_id}{note}")
        job = await _follow(client, job_id, console, show=not args.no_progress)
        if job.status == "failed" and not _all_results(job):
            return job, None
        # a job that failed after its last result (its own files, its state directory) still
        # gets its output written: the results may be readable only by this process
        return job, await _export(client, job_id, args.output, args.errors)


def _all_results(job: Batch) -> bool:
    counts = job.request_counts
    return job.in_progress_at is not None and counts.completed + counts.failed == counts.total


async def _export(
    client: BatchClient, job_id: str, output: Path, errors: Path | None
) -> str | None:
    """Write the output files, retried as a job's own files are; None, or why it failed."""
    policy = WriteRetry()
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(policy.attempts),
            wait=wait_exponential(multiplier=policy.initial_s, max=policy.max_s),
            retry=retry_if_exception_type(OSError),
            reraise=True,
        ):
            with attempt:
                await client.batches.export(job_id, output, errors)
    except OSError as exc:
        reason = f"[Errno {exc.errno}] {exc.strerror}" if exc.strerror else str(exc)
        return (
            f"could not write {exc.filename or output}: {reason}; every result is kept in the "
            "state directory: run the same command again to write it"
        )
    return None


async def _follow(client: BatchClient, job_id: str, console: Console, *, show: bool) -> Batch:
    """Poll the job until it is terminal, drawing done/failed/total, tokens/s and ETA."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TextColumn("{task.fields[cached]} cached"),
        TextColumn("{task.fields[tps]:.0f} tok/s"),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TimeElapsedColumn(),
    )
    job = await client.batches.retrieve(job_id)
    start_tokens, started = job.usage.output_tokens, time.monotonic()
    with Progress(*columns, console=console, disable=not show, transient=False) as progress:
        task = progress.add_task(
            job.status, total=job.request_counts.total or None, failed=0, cached=0, tps=0.0
        )
        while True:
            counts = job.request_counts
            elapsed = max(time.monotonic() - started, 1e-6)
            progress.update(
                task,
                description=job.status,
                total=counts.total or None,
                completed=counts.completed + counts.failed,
                failed=counts.failed,
                cached=job.cache_hits,
                tps=(job.usage.output_tokens - start_tokens) / elapsed,
            )
            if job.status not in BatchStatus.ACTIVE:
                return job
            if not client.batches.running_here(job_id):
                # it stopped here without reaching a terminal state (a failure that could not
                # be recorded reads ``failed`` already): wait for whoever finishes it
                job = await client.batches.wait(job_id)
                continue
            await anyio.sleep(0.25)
            job = await client.batches.retrieve(job_id)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1024 * 1024), b""):
            digest.update(chunk)
    return digest.hexdigest()
