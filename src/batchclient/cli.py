"""The ``batchclient`` command: ``run`` an OpenAI batch file (like ``vllm run-batch``, but durable
and resumable), manage ``jobs`` (guide: ``docs/jobs.md``), and ``bench`` every mode on identical
requests (guide: ``docs/benchmarks.md``).

    batchclient run INPUT.jsonl -o OUTPUT.jsonl [--errors ERRORS.jsonl]
                    --provider remote --base-url URL [--api-key KEY] [--max-concurrency N]
                  | --provider vllm [--model M] [--engine-arg KEY=VALUE ...]
    batchclient jobs list | status ID | cancel ID | result ID [-o FILE] [--errors FILE]
    batchclient bench [-n 256] [--modes ...] [--concurrency 8 64 256] [--repeat N] [--base-url URL]

``run`` and ``jobs`` take ``--state-dir`` (default ``$BATCHCLIENT_STATE_DIR`` or the user data
directory). Subcommands register themselves in :data:`COMMANDS`; add one with a function that
takes the subparsers and the shared parent parser.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.table import Table

from .errors import BatchClientError, ConfigurationError
from .jobs import JobManager, default_state_dir

Handler = Callable[[argparse.Namespace], int]
Register = Callable[
    ["argparse._SubParsersAction[argparse.ArgumentParser]", argparse.ArgumentParser], None
]


def _add_run(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    from ._cli_run import add_run_arguments, run_command

    p = sub.add_parser(
        "run",
        parents=[common],
        help="run an OpenAI batch JSONL file to an output file (resumable)",
        description="Run every request of an OpenAI batch input file and write the OpenAI batch "
        "output lines. Durable: results are committed to the state directory as they complete; "
        "run the same command again after an interruption and only unfinished requests are sent. "
        "A finished job is not run again: its output files are rebuilt.",
    )
    add_run_arguments(p)
    p.set_defaults(func=run_command)


def _add_jobs(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    p = sub.add_parser("jobs", parents=[common], help="list, inspect, cancel and export jobs")
    jobs = p.add_subparsers(
        dest="jobs_command", required=True, metavar="{list,status,cancel,result}"
    )
    ls = jobs.add_parser(
        "list", parents=[common], help="the jobs of the state directory, newest first"
    )
    ls.add_argument("--limit", type=int, default=None, help="show at most N jobs")
    ls.add_argument("--json", action="store_true", help="one JSON job record per line")
    ls.set_defaults(func=_jobs_list)
    st = jobs.add_parser(
        "status", parents=[common], help="a job's record (OpenAI batch object, JSON)"
    )
    st.add_argument("job_id")
    st.set_defaults(func=_jobs_status)
    ca = jobs.add_parser("cancel", parents=[common], help="cancel a job, keeping finished results")
    ca.add_argument("job_id")
    ca.set_defaults(func=_jobs_cancel)
    re = jobs.add_parser(
        "result",
        parents=[common],
        help="write a job's output lines (stdout, or -o); finished lines only if still running",
    )
    re.add_argument("job_id")
    re.add_argument("-o", "--output", type=Path, default=None, help="output file (default stdout)")
    re.add_argument("--errors", type=Path, default=None, help="write failed lines here instead")
    re.set_defaults(func=_jobs_result)


def _add_bench(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    from ._bench import add_arguments, bench_command

    p = sub.add_parser(
        "bench",
        help="benchmark every mode on identical ShareGPT requests: table, JSON and chart",
        description="The original experiment in one run: one request at a time (sequential), "
        "batchclient's remote fan-out and inline engine, raw vllm.LLM.chat (the ceiling) and "
        "peer clients (AsyncOpenAI + semaphore, litellm) on identical requests. Prints a "
        "Markdown table; writes NAME.json, NAME.png and NAME.md under --out. Guide: "
        "docs/benchmarks.md.",
    )
    add_arguments(p)
    p.set_defaults(func=bench_command)


COMMANDS: list[Register] = [_add_run, _add_jobs, _add_bench]
"""Subcommand registrars, in help order."""


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        type=Path,
        default=argparse.SUPPRESS,  # so `jobs --state-dir X list` is not reset by `list`
        help=f"where files, jobs and results are kept (default: {default_state_dir()})",
    )
    parser = argparse.ArgumentParser(prog="batchclient", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for register in COMMANDS:
        register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``batchclient`` console script; returns the exit status (0 success,
    1 a job that did not complete or an error, 2 bad usage, 130 interrupted)."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.func
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("interrupted: run the same command again to resume", file=sys.stderr)
        return 130
    except ConfigurationError as exc:
        print(f"batchclient: {exc}", file=sys.stderr)
        return 2
    except BatchClientError as exc:
        print(f"batchclient: {exc}", file=sys.stderr)
        return 1


# ---------------------------------------------------------------------------------------- jobs


def _manager(args: argparse.Namespace) -> JobManager:
    return JobManager(getattr(args, "state_dir", None))


def _jobs_list(args: argparse.Namespace) -> int:
    async def go() -> list[Any]:
        async with _manager(args) as m:
            return await m.list(args.limit)

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
    async def go() -> str:
        async with _manager(args) as m:
            return (await m.info(args.job_id)).model_dump_json(indent=2)

    print(anyio.run(go))
    return 0


def _jobs_cancel(args: argparse.Namespace) -> int:
    async def go() -> str:
        async with _manager(args) as m:
            await m.cancel(args.job_id)
            return (await m.info(args.job_id)).status

    print(f"{args.job_id}: {anyio.run(go)}")
    return 0


def _jobs_result(args: argparse.Namespace) -> int:
    async def go() -> str:
        async with _manager(args) as m:
            job = await m.info(args.job_id)
            if args.output is None:
                store = await m.store()
                from .jobs._output import iter_output_lines

                def dump() -> None:
                    for line in iter_output_lines(store, args.job_id):
                        sys.stdout.buffer.write(line)
                    sys.stdout.flush()

                await anyio.to_thread.run_sync(dump)
            else:
                await m.export(args.job_id, args.output, args.errors)
            return job.status

    status = anyio.run(go)
    if status not in ("completed", "cancelled", "expired"):
        print(
            f"note: job {args.job_id} is {status}: only finished lines were written",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
