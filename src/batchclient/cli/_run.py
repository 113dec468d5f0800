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
from .._core.provider import Provider
from ..batchapi import FLAVORS, PRICE_NOTES, flavor_of
from ..errors import ConfigurationError
from ..jobs import (
    JobManager,
    WriteRetry,
    describe,
    estimate_file,
    file_endpoint,
)
from ..types import Batch, BatchStatus

RUN_KEY = "batchclient_run"


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
        default="24h",
        help="how long the job may run, e.g. 24h, 30m (default 24h)",
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


def add_provider_arguments(
    p: argparse.ArgumentParser, *, api_key_flag: str, batch_api: bool = False
) -> None:
    """The options that choose and configure a provider (``run`` and ``serve`` share them;
    :func:`make_provider` builds it); ``api_key_flag`` names the option of
    the remote endpoint's key (``serve`` keeps ``--api-key`` for its own keys). ``batch_api``
    adds ``--provider batch-api`` and its options (``run`` only: a remote Batch API runs whole
    files, not the one request at a time a server in front of it would send)."""
    # the batch providers (no result cache) run whole files: ``run`` only
    choices = [name for name, e in registry.PROVIDERS.items() if batch_api or e.cache]
    p.add_argument(
        "--provider",
        choices=choices,
        default="remote",
        help="remote: live fan-out to an OpenAI-compatible server; vllm: an engine in this "
        "process; ray: engine replicas as Ray actors"
        + (
            "; batch-api: a remote OpenAI Batch API (/v1/files + /v1/batches: OpenAI's "
            "discounted batches, or a `batchclient serve`); anthropic-batch: Anthropic Message "
            "Batches (key: --api-key or $ANTHROPIC_API_KEY); gemini-batch: the Gemini Batch API "
            "(key: --api-key, $GEMINI_API_KEY or $GOOGLE_API_KEY)"
            if batch_api
            else ""
        ),
    )
    where = "remote, batch-api" if batch_api else "remote"
    others = "; anthropic-batch, gemini-batch: " if batch_api else ""
    p.add_argument(
        "--base-url",
        help=f"{where}: API root ending in /v1"
        + (f"{others}the API root (default: the provider's own)" if others else ""),
    )
    p.add_argument(
        api_key_flag,
        dest="upstream_api_key",
        metavar="KEY",
        default=None,
        help=f"{where}: bearer token sent to --base-url (default $OPENAI_API_KEY; for a "
        "Together, Groq or Mistral host: $TOGETHER_API_KEY, $GROQ_API_KEY, $MISTRAL_API_KEY)"
        + (
            f"{others}their key (default $ANTHROPIC_API_KEY; $GEMINI_API_KEY or $GOOGLE_API_KEY)"
            if others
            else ""
        ),
    )
    if batch_api:
        p.add_argument(
            "--flavor",
            choices=sorted(FLAVORS),
            default=None,
            help="batch-api: which provider's variant of the Batch API (default: from the "
            "--base-url host, api.together.xyz / api.groq.com / api.mistral.ai, else openai)",
        )
        p.add_argument(
            "--poll-interval",
            type=float,
            default=None,
            metavar="SECONDS",
            help="batch-api, anthropic-batch, gemini-batch: seconds between two polls of a "
            "remote batch (default 10)",
        )
        p.add_argument(
            "--max-lines",
            type=int,
            default=None,
            help="batch-api, anthropic-batch, gemini-batch: most requests in one remote batch; "
            "more are split (default: the flavour's or provider's limit, 50000 for batch-api)",
        )
        p.add_argument(
            "--max-bytes",
            type=int,
            default=None,
            help="batch-api, anthropic-batch, gemini-batch: largest remote batch in bytes "
            "(default: the flavour's or provider's limit, 200 MiB for openai, 100 MiB for the "
            "other flavours)",
        )
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        help="requests in flight (remote: per endpoint, default 64; vllm: handed to the engine "
        "at once, default 1024; ray: per replica, default 1024)",
    )
    p.add_argument(
        "--max-retries",
        type=int,
        default=None,
        help="remote: retries per request (default 4)"
        + ("; batch-api: retries per API call (default 8)" if batch_api else ""),
    )
    p.add_argument("--timeout", type=float, default=600.0, help="remote: seconds per attempt")
    p.add_argument("--model", default=None, help="vllm, ray: model path or name (default: bundled)")
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="vllm, ray: an engine argument (value parsed as JSON if it can be), repeatable",
    )
    p.add_argument("--replicas", type=int, default=1, help="ray: engine replicas (default 1)")
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDRESS",
        help="ray: an existing cluster (auto, ray://host:10001); default: start a local Ray",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="vllm: show everything vLLM prints (default: its warnings and errors only; "
        "BATCHCLIENT_VERBOSE=1 does the same)",
    )
    p.add_argument(
        "--cache",
        action="store_true",
        help="answer from the result cache in the state directory and fill it (successes only)",
    )
    p.add_argument(
        "--cores-per-replica",
        type=int,
        default=None,
        metavar="N",
        help="ray, CPU: cores each replica binds (default: a one-node Ray's cores divided "
        "among the replicas, else each replica's num_cpus)",
    )
    p.add_argument(
        "--replica-resource",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="ray: a Ray resource of each replica (num_cpus=2, num_gpus=1, ...), repeatable",
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


def provider_options(args: argparse.Namespace) -> dict[str, Any]:
    """The registry options (:func:`batchclient._registry.make_client`) that the flags of
    :func:`add_provider_arguments` give ``--provider``: only the flags that provider reads, and
    only those given (the provider's own defaults otherwise)."""
    name = args.provider
    options: dict[str, Any]
    if name in ("anthropic-batch", "gemini-batch"):
        if getattr(args, "flavor", None) is not None:  # said, so not to be dropped in silence
            raise ConfigurationError(f"--flavor is for --provider batch-api, not {name}")
        key = args.upstream_api_key
        if getattr(args, "dry_run", False) and not key:
            key = "unused-by-dry-run"  # nothing is sent, so an estimate needs no key
        options = {"api_key": key, "base_url": args.base_url, "timeout_s": args.timeout}
        return {**options, **_batch_options(args)}
    if name in ("remote", "batch-api"):
        if not args.base_url:
            raise ConfigurationError(f"--provider {name} needs --base-url")
        flavor = getattr(args, "flavor", None) if name == "batch-api" else None
        key = args.upstream_api_key or os.environ.get(_key_variable(flavor, args.base_url))
        options = {"base_url": args.base_url, "api_key": key}
        if name == "batch-api":
            options.update(timeout_s=args.timeout, flavor=flavor, **_batch_options(args))
            if getattr(args, "completion_window", None):
                options["completion_window"] = args.completion_window
            return options
        options["timeout"] = args.timeout
        if args.max_retries is not None:
            options["max_retries"] = args.max_retries
        if args.max_concurrency:
            options["max_concurrency"] = args.max_concurrency
        return options
    options = {"model": args.model}
    if args.max_concurrency:
        options["max_concurrency"] = args.max_concurrency
    if name == "ray":
        options.update(
            replicas=args.replicas,
            address=args.ray_address,
            resources_per_replica=_key_values(args.replica_resource, "--replica-resource"),
            cores_per_replica=args.cores_per_replica,
        )
    else:
        options["verbose"] = getattr(args, "verbose", False)
    engine_args = _key_values(args.engine_arg, "--engine-arg")
    taken = sorted(set(engine_args) & set(options))
    if taken:
        raise ConfigurationError(
            f"--engine-arg {', '.join(taken)}: give these with their own flags"
        )
    return {**options, **engine_args}


def _batch_options(args: argparse.Namespace) -> dict[str, Any]:
    """The batch providers' options given as flags (their own defaults otherwise)."""
    flags = {"poll_interval_s": "poll_interval", "max_retries": "max_retries"}
    flags.update(max_lines="max_lines", max_bytes="max_bytes")
    given = {name: getattr(args, flag, None) for name, flag in flags.items()}
    return {name: value for name, value in given.items() if value is not None}


def _key_variable(flavor: str | None, base_url: str) -> str:
    """The environment variable holding the key for a flavour (named, or read from the URL):
    an OpenAI key is never sent to another provider's host."""
    name = flavor_of(flavor, base_url or "").name
    return f"{name.upper()}_API_KEY"


def make_provider(args: argparse.Namespace) -> Provider:
    """The provider the options of :func:`add_provider_arguments` describe (not started), from
    the provider registry. Raises ``ConfigurationError`` for options that do not fit
    together."""
    return registry.make_provider(args.provider, **provider_options(args))


def _key_values(items: list[str], flag: str) -> dict[str, Any]:
    """``KEY=VALUE`` options as a dict, each value parsed as JSON when it is JSON."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigurationError(f"{flag} {item!r} is not KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def make_client(args: argparse.Namespace) -> BatchClient:
    """The client ``run`` uses: the registry's client of ``--provider`` with the
    ``--state-dir`` and ``--cache`` (``batch-api``: :class:`~batchclient.BatchAPIBatchInference`,
    which runs whole jobs)."""
    return registry.make_client(
        args.provider,
        state_dir=getattr(args, "state_dir", None),
        cache=getattr(args, "cache", False),
        **provider_options(args),
    )


def run_command(args: argparse.Namespace) -> int:
    _check_paths(args)
    client = make_client(args)
    if args.dry_run:
        return _dry_run(client, args)
    console = Console(stderr=True)
    job, written = anyio.run(_run, client, args, console)
    counts, usage = job.request_counts, job.usage
    hits = f"; {job.cache_hits} from the cache" if args.cache or job.cache_hits else ""
    print(
        f"{job.id}: {job.status}; {counts.completed} completed, {counts.failed} failed of "
        f"{counts.total}{hits}; {usage.input_tokens} input / {usage.output_tokens} output tokens"
    )
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


def _dry_run(client: BatchClient, args: argparse.Namespace) -> int:
    """``--dry-run``: nothing is sent and no engine is started (the provider is not entered;
    the remote one may ask ``GET /models`` for the model's identity and tokenizer)."""

    async def go() -> Any:
        cache = None
        manager = JobManager(client.state_dir)
        async with manager:
            if args.cache and (client.state_dir / "batchclient.sqlite3").exists():
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
                )
            finally:
                await client.provider.stop()

    estimate = anyio.run(go)
    for line in describe(estimate):
        print(line)
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
                    completion_window=args.completion_window,
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
