"""``batchclient jobs``: list, inspect, cancel, resume and export the batches of a state
directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.table import Table

from ..jobs import JobManager
from ..types import Batch, BatchEta


def add_jobs_arguments(p: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    jobs = p.add_subparsers(
        dest="jobs_command", required=True, metavar="{list,status,cancel,resume,result}"
    )
    ls = jobs.add_parser(
        "list", parents=[common], help="the jobs of the state directory, newest first"
    )
    ls.add_argument("--limit", type=int, default=None, help="show at most N jobs")
    ls.add_argument("--json", action="store_true", help="one JSON job record per line")
    ls.set_defaults(func=_jobs_list)
    st = jobs.add_parser(
        "status",
        parents=[common],
        help="a job's record (OpenAI batch object, JSON, with progress and ETA while it runs; "
        "a summary line on stderr)",
    )
    st.add_argument("job_id")
    st.set_defaults(func=_jobs_status)
    ca = jobs.add_parser("cancel", parents=[common], help="cancel a job, keeping finished results")
    ca.add_argument("job_id")
    ca.set_defaults(func=_jobs_cancel)
    rs = jobs.add_parser(
        "resume",
        parents=[common],
        help="reopen a job that failed after validation (its output did not fit, its disk was "
        "full or read-only), once the cause is fixed; a server on the state directory takes "
        "it up within seconds",
    )
    rs.add_argument("job_id")
    rs.set_defaults(func=_jobs_resume)
    re = jobs.add_parser(
        "result",
        parents=[common],
        help="write a job's output lines (stdout, or -o); finished lines only if still running",
    )
    re.add_argument("job_id")
    re.add_argument("-o", "--output", type=Path, default=None, help="output file (default stdout)")
    re.add_argument("--errors", type=Path, default=None, help="write failed lines here instead")
    re.set_defaults(func=_jobs_result)


def _manager(args: argparse.Namespace) -> JobManager:
    return JobManager(getattr(args, "state_dir", None))


def _jobs_list(args: argparse.Namespace) -> int:
    async def go() -> list[Any]:
        async with _manager(args) as m:
            return await m.batches.list(limit=args.limit)

    jobs = anyio.run(go)
    if args.json:
        for job in jobs:
            print(job.model_dump_json())
        return 0
    header = ("id", "status", "created", "total", "completed", "failed", "model", "input")
    rows = [
        (
            job.id,
            job.status,
            _when(job.created_at),
            str(job.request_counts.total),
            str(job.request_counts.completed),
            str(job.request_counts.failed),
            job.model or "",
            job.input_file_id,
        )
        for job in jobs
    ]
    console = Console()
    if not console.is_terminal:  # pipes and files get plain tab-separated lines
        for row in [header, *rows]:
            print("\t".join(row))
        return 0
    table = Table(*header)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    return 0


def _when(ts: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _jobs_status(args: argparse.Namespace) -> int:
    async def go() -> Batch:
        async with _manager(args) as m:
            return await m.batches.retrieve(args.job_id)

    job = anyio.run(go)
    print(job.model_dump_json(indent=2))
    if job.progress is not None:
        print(f"{job.id}: {progress_line(job.progress)}", file=sys.stderr)
    return 0


def progress_line(progress: BatchEta) -> str:
    """``25.0 % done, 3.2 requests/s, about 1m20s left`` (rate and time when known)."""
    parts = [f"{progress.completed_fraction * 100:.1f} % done"]
    if progress.requests_per_s is not None:
        parts.append(f"{progress.requests_per_s:.3g} requests/s")
    if progress.eta_s is not None:
        minutes, seconds = divmod(round(progress.eta_s), 60)
        hours, minutes = divmod(minutes, 60)
        left = f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"
        parts.append(f"about {left} left")
    return ", ".join(parts)


def _jobs_cancel(args: argparse.Namespace) -> int:
    async def go() -> str:
        async with _manager(args) as m:
            return (await m.batches.cancel(args.job_id)).status

    print(f"{args.job_id}: {anyio.run(go)}")
    return 0


def _jobs_resume(args: argparse.Namespace) -> int:
    async def go() -> str:
        async with _manager(args) as m:
            return (await m.batches.resume(args.job_id)).status

    print(
        f"{args.job_id}: {anyio.run(go)}; only lines without a result will be sent. A "
        "`batchclient serve` running on this state directory takes it up within a few seconds; "
        "otherwise the next client with the job's provider started on it does (`batchclient "
        "run` with the same input and provider: run it again)."
    )
    return 0


def _jobs_result(args: argparse.Namespace) -> int:
    async def go() -> str:
        async with _manager(args) as m:
            job = await m.batches.retrieve(args.job_id)
            if args.output is None:
                await m.write_lines(args.job_id, sys.stdout.buffer)
            else:
                await m.batches.export(args.job_id, args.output, args.errors)
            return job.status

    status = anyio.run(go)
    if status not in ("completed", "cancelled", "expired"):
        print(
            f"note: job {args.job_id} is {status}: only finished lines were written",
            file=sys.stderr,
        )
    return 0
