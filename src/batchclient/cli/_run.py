"""``batchclient run``: one OpenAI batch file through a provider, with a live progress bar, durable
and resumable.

Resume key (peer lesson 18: content and config only): SHA-256 of the input's bytes plus the
provider's identity (remote: base URL; inline: the model), kept in the job's metadata as
``batchclient_run``. Running the same command again

- attaches to the job if it is still active (this client resumed it on entry);
- sends nothing if it completed, and rebuilds the output files (peer lesson 17);
- otherwise (cancelled, expired, failed) starts a new job that reuses every successful result of
  the previous one, so only what did not succeed is sent again.
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

from .._core.client import BatchClient
from .._core.provider import Provider
from ..errors import ConfigurationError
from ..types import Batch

RUN_KEY = "batchclient_run"
_ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, help="OpenAI batch input file (JSONL)")
    p.add_argument("-o", "--output", type=Path, required=True, help="output file (JSONL)")
    p.add_argument(
        "--errors",
        type=Path,
        default=None,
        help="write failed lines here (default: every line goes to --output, as vllm run-batch)",
    )
    add_provider_arguments(p, api_key_flag="--api-key", batch_api=True)
    p.add_argument(
        "--completion-window",
        default="24h",
        help="how long the job may run, e.g. 24h, 30m (default 24h)",
    )
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")


def add_provider_arguments(
    p: argparse.ArgumentParser, *, api_key_flag: str, batch_api: bool = False
) -> None:
    """The provider options ``run`` and ``serve`` share; ``api_key_flag`` names the option of
    the remote endpoint's key (``serve`` keeps ``--api-key`` for its own keys). ``batch_api``
    adds ``--provider batch-api`` and its options (``run`` only: a remote Batch API runs whole
    files, not the one request at a time a server in front of it would send)."""
    choices = ("remote", "vllm", "batch-api") if batch_api else ("remote", "vllm")
    p.add_argument(
        "--provider",
        choices=choices,
        default="remote",
        help="remote: live fan-out to an OpenAI-compatible server; vllm: an engine in this "
        "process"
        + (
            "; batch-api: a remote OpenAI Batch API (/v1/files + /v1/batches: OpenAI's "
            "discounted batches, or a `batchclient serve`)"
            if batch_api
            else ""
        ),
    )
    p.add_argument("--base-url", help="remote, batch-api: API root ending in /v1")
    p.add_argument(
        api_key_flag,
        dest="upstream_api_key",
        metavar="KEY",
        default=os.environ.get("OPENAI_API_KEY"),
        help="remote, batch-api: bearer token sent to --base-url (default $OPENAI_API_KEY)",
    )
    if batch_api:
        p.add_argument(
            "--poll-interval",
            type=float,
            default=10.0,
            help="batch-api: seconds between two polls of a remote batch (default 10)",
        )
        p.add_argument(
            "--max-lines",
            type=int,
            default=50_000,
            help="batch-api: most requests in one remote batch; more are split (default 50000)",
        )
        p.add_argument(
            "--max-bytes",
            type=int,
            default=200 * 1024 * 1024,
            help="batch-api: largest remote input file in bytes (default 200 MiB)",
        )
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="requests in flight (remote: per endpoint, default 64; vllm: handed to the engine "
        "at once, default 1024)",
    )
    p.add_argument("--max-retries", type=int, default=4, help="remote: retries per request")
    p.add_argument("--timeout", type=float, default=600.0, help="remote: seconds per attempt")
    p.add_argument("--model", default=None, help="vllm: model path or name (default: bundled)")
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="vllm: an engine argument (value parsed as JSON if it can be), repeatable",
    )


def _check_paths(args: argparse.Namespace) -> None:
    """C11: never write over the input (or errors over output)."""
    inp: Path = args.input
    if not inp.is_file():
        raise ConfigurationError(f"input {inp} is not a file")
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


def make_provider(args: argparse.Namespace) -> Provider:
    """The provider the options of :func:`add_provider_arguments` describe."""
    if args.provider == "remote":
        if not args.base_url:
            raise ConfigurationError("--provider remote needs --base-url")
        from ..remote import RemoteProvider

        return RemoteProvider(
            args.base_url,
            args.upstream_api_key,
            max_concurrency=args.max_concurrency or 64,
            max_retries=args.max_retries,
            timeout=args.timeout,
        )
    engine_args: dict[str, Any] = {}
    for item in args.engine_arg:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigurationError(f"--engine-arg {item!r} is not KEY=VALUE")
        try:
            engine_args[key] = json.loads(value)
        except ValueError:
            engine_args[key] = value
    from ..inline import VLLMProvider  # vLLM itself is imported when the engine starts

    max_concurrency = {"max_concurrency": args.max_concurrency} if args.max_concurrency else {}
    return VLLMProvider(args.model, **max_concurrency, **engine_args)


def make_client(args: argparse.Namespace) -> BatchClient:
    state_dir = getattr(args, "state_dir", None)
    if args.provider == "batch-api":
        if not args.base_url:
            raise ConfigurationError("--provider batch-api needs --base-url")
        from ..batchapi import BatchAPIBatchInference

        return BatchAPIBatchInference(
            args.base_url,
            args.upstream_api_key,
            poll_interval=args.poll_interval,
            max_lines=args.max_lines,
            max_bytes=args.max_bytes,
            completion_window=args.completion_window,
            timeout=args.timeout,
            state_dir=state_dir,
        )
    return BatchClient(make_provider(args), state_dir=state_dir)


def run_command(args: argparse.Namespace) -> int:
    _check_paths(args)
    client = make_client(args)
    console = Console(stderr=True)
    job = anyio.run(_run, client, args, console)
    counts, usage = job.request_counts, job.usage
    print(
        f"{job.id}: {job.status}; {counts.completed} completed, {counts.failed} failed of "
        f"{counts.total}; {usage.input_tokens} input / {usage.output_tokens} output tokens"
    )
    if job.status == "failed":
        for error in (job.errors.data if job.errors else [])[:20]:
            where = f"line {error.line}: " if error.line else ""
            param = f" ({error.param})" if error.param else ""
            print(f"  {where}{error.code}{param}: {error.message}", file=sys.stderr)
        return 1
    print(f"output: {args.output}" + (f"; errors: {args.errors}" if args.errors else ""))
    return 0 if job.status == "completed" else 1


async def _run(client: BatchClient, args: argparse.Namespace, console: Console) -> Batch:
    async with client:
        sha = await anyio.to_thread.run_sync(_sha256, args.input)
        identity = json.dumps(client.provider.identity(), sort_keys=True)
        key = hashlib.sha256(f"{sha}\n{identity}".encode()).hexdigest()[:40]
        previous = [
            j for j in await client.batches.list() if (j.metadata or {}).get(RUN_KEY) == key
        ]
        latest = previous[0] if previous else None
        if latest is not None and latest.status in _ACTIVE:
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
        else:
            reuse = latest.id if latest is not None and latest.status != "failed" else None
            record = await client.files.create(args.input)
            job_id = (
                await client.schedule_batch(
                    record.id,
                    completion_window=args.completion_window,
                    metadata={RUN_KEY: key},
                    reuse_results_from=reuse,
                )
            ).job_id
            note = f", reusing the successful results of {reuse}" if reuse else ""
            console.print(f"started job {job_id}{note}")
        job = await _follow(client, job_id, console, show=not args.no_progress)
        if job.status != "failed":
            await client.batches.export(job_id, args.output, args.errors)
        return job


async def _follow(client: BatchClient, job_id: str, console: Console, *, show: bool) -> Batch:
    """Poll the job until it is terminal, drawing done/failed/total, tokens/s and ETA."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TextColumn("{task.fields[tps]:.0f} tok/s"),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TimeElapsedColumn(),
    )
    job = await client.batches.retrieve(job_id)
    start_tokens, started = job.usage.output_tokens, time.monotonic()
    with Progress(*columns, console=console, disable=not show, transient=False) as progress:
        task = progress.add_task(
            job.status, total=job.request_counts.total or None, failed=0, tps=0.0
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
                tps=(job.usage.output_tokens - start_tokens) / elapsed,
            )
            if job.status not in _ACTIVE:
                return job
            await anyio.sleep(0.25)
            job = await client.batches.retrieve(job_id)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1024 * 1024), b""):
            digest.update(chunk)
    return digest.hexdigest()
