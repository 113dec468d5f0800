"""The ``batchclient`` command: ``run`` an OpenAI batch file (like ``vllm run-batch``, but durable
and resumable), ``serve`` the OpenAI Files + Batches API over HTTP (guide: ``docs/server.md``),
manage ``jobs`` (guide: ``docs/jobs.md``), and ``bench`` every mode on identical requests
(guide: ``docs/benchmarks.md``).

    batchclient run INPUT.jsonl -o OUTPUT.jsonl [--errors ERRORS.jsonl]
                    --provider remote --base-url URL [--api-key KEY] [--max-concurrency N]
                  | --provider vllm [--model M] [--engine-arg KEY=VALUE ...]
                  | --provider ray [--replicas N] [--address A] [--model M]
                                   [--resources-per-replica KEY=VALUE ...] [--engine-arg ...]
                  | --provider batch-api --base-url URL [--poll-interval S] [--max-lines N]
                  (every option of the provider is a flag: batchclient providers lists them)
    batchclient serve [--host 127.0.0.1] [--port 8000] [--api-key KEY ...]
                    --provider remote --base-url URL | --provider vllm [--model M]
    batchclient run INPUT.jsonl ... [--cache] | --dry-run [--tokenizer DIR] [--price-input USD]
                    [--price-output USD]
    batchclient jobs list | status ID | cancel ID | result ID [-o FILE] [--errors FILE]
    batchclient cache stats | clear [--older-than 7d] [--model M]
    batchclient bench [-n 256] [--modes ...] [--max-concurrency 8 64 256] [--repeat N]
                      [--base-url URL]
    batchclient lm-eval --provider remote --base-url URL --model NAME [--tokenizer DIR]
                      | --provider vllm [--model M] [--engine-arg KEY=VALUE ...]
                      -- <lm-eval arguments: --tasks ... --include_path ... --limit N>
    batchclient providers [NAME]

``run``, ``serve``, ``jobs``, ``cache`` and ``lm-eval`` take ``--state-dir`` (default
``$BATCHCLIENT_STATE_DIR`` or the user data directory); ``batchclient --version`` prints the
version. Subcommands register themselves in :data:`COMMANDS`; add one with a function that
takes the subparsers and the shared parent parser. Help is printed as plain text: reST markup in
a description or a flag's help (literals, roles) is shown without it (:func:`plain`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .._engine_defaults import quick_engine_stops
from .._state import DATABASE_ENV
from .._version import __version__
from ..errors import BatchClientError, ConfigurationError
from ..jobs._store import default_state_dir
from ._signals import exit_now, sigterm_as_interrupt

DESCRIPTION = (
    "Batch inference for LLM evaluations: run an OpenAI batch file (like vllm run-batch, but "
    "durable and resumable), serve the OpenAI Files + Batches API over HTTP, manage jobs and "
    "the result cache, benchmark every mode on identical requests, and run lm-evaluation-harness "
    "over any provider. Guides: README.md and docs/ (server.md, jobs.md, benchmarks.md, evals.md)."
)

Handler = Callable[[argparse.Namespace], int]
Register = Callable[
    ["argparse._SubParsersAction[argparse.ArgumentParser]", argparse.ArgumentParser], None
]


def _add_run(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    from ._run import add_run_arguments, run_command

    p = sub.add_parser(
        "run",
        parents=[common],
        help="run an OpenAI batch JSONL file to an output file (resumable)",
        description="Run every request of an OpenAI batch input file and write the OpenAI batch "
        "output lines. Durable: results are committed to the state directory as they complete; "
        "run the same command again after an interruption and only unfinished requests are sent. "
        "A finished job is not run again: its output files are rebuilt. --cache answers from the "
        "result cache; --dry-run sends nothing and prints what a run would take.",
    )
    add_run_arguments(p)
    p.set_defaults(func=run_command)


def _add_jobs(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    from ._jobs import add_jobs_arguments

    p = sub.add_parser("jobs", parents=[common], help="list, inspect, cancel and export jobs")
    add_jobs_arguments(p, common)


def _add_cache(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    from ._cache import add_cache_arguments

    p = sub.add_parser("cache", parents=[common], help="the result cache: stats, clear")
    add_cache_arguments(p, common)


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


def _add_demo(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    from ._demo import add_demo_arguments, demo_command

    p = sub.add_parser(
        "demo",
        help="the main job: ShareGPT conversations through a local vLLM server, batched and not",
        description="Sample ShareGPT V3 conversations, start the real vLLM OpenAI server with the "
        "bundled model, run them with many in flight and a few one at a time, print the table and "
        "write every answer (what make demo runs first).",
    )
    add_demo_arguments(p)
    p.set_defaults(func=demo_command)


def _add_serve(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    from ._serve import add_serve_arguments, serve_command

    p = sub.add_parser(
        "serve",
        parents=[common],
        help="serve the OpenAI Files + Batches API (durable batches) over HTTP",
        description="An OpenAI-compatible /v1/files, /v1/batches, /v1/models and "
        "/v1/chat/completions server, plus the original /batch-inference routes, in front of a "
        "provider. Batches are durable: after a crash, start it again on the same state "
        "directory and they resume. Guide: docs/server.md.",
    )
    add_serve_arguments(p)
    p.set_defaults(func=serve_command)


def _add_providers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    from ._providers import add_providers_arguments, providers_command

    p = sub.add_parser(
        "providers",
        help="list the providers, their arguments and options with defaults",
        description="Every name --provider takes, what it stands for, and each of its options "
        "with its default and what it does (the flags of run, serve and lm-eval are these "
        "options: max_concurrency is --max-concurrency, timeout_s is --timeout).",
    )
    add_providers_arguments(p)
    p.set_defaults(func=providers_command)


def _add_lm_eval(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    from ._lm_eval import add_lm_eval_arguments, lm_eval_command

    p = sub.add_parser(
        "lm-eval",
        parents=[common],
        help="run lm-evaluation-harness with batchclient as its model",
        description="lm-evaluation-harness with --model batchclient over the remote or "
        "inline provider; arguments after -- go to lm-eval unchanged. Answers are kept in "
        "the state directory: a re-run of the same eval sends nothing. Needs the eval extra "
        "(pip install 'batchclient[eval]'). Guide: docs/evals.md.",
    )
    add_lm_eval_arguments(p)
    p.set_defaults(func=lm_eval_command)


COMMANDS: list[Register] = [
    _add_run,
    _add_serve,
    _add_jobs,
    _add_cache,
    _add_bench,
    _add_demo,
    _add_lm_eval,
    _add_providers,
]
"""Subcommand registrars, in help order."""


_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`]*)`")
_LITERAL = re.compile(r"``([^`]*)``|`([^`]*)`|\*\*([^*]*)\*\*")


def plain(text: str) -> str:
    """``text`` without reST markup, as ``--help`` prints it: a role's target
    (``:class:`~a.B``` -> ``B``, ``:data:`X``` -> ``X``), and the content of literals (double or
    single backticks) and ``**bold**``."""
    text = _ROLE.sub(lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], text)
    return _LITERAL.sub(lambda m: m[1] or m[2] or m[3] or "", text)


class _PlainFormatter(argparse.HelpFormatter):
    """argparse's formatter over :func:`plain` text: descriptions and every flag's help."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def _expand_help(self, action: argparse.Action) -> str:
        return plain(super()._expand_help(action))


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that prints plain help; its subparsers are ``_Parser`` too
    (``add_subparsers`` makes them of the parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _PlainFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        type=Path,
        default=argparse.SUPPRESS,  # so `jobs --state-dir X list` is not reset by `list`
        help=f"where files, jobs and results are kept (default: {default_state_dir()})",
    )
    common.add_argument(
        "--database",
        default=argparse.SUPPRESS,
        metavar="URL",
        help="a postgresql:// URL holding files, jobs and results instead of the state "
        f"directory's SQLite file, shared by processes on any host (default: ${DATABASE_ENV})",
    )
    parser: argparse.ArgumentParser = _Parser(prog="batchclient", description=DESCRIPTION)
    parser.add_argument(
        "--version",
        action="version",
        version=f"batchclient {__version__}",
        help="print the version",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for register in COMMANDS:
        register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``batchclient`` console script; returns the exit status (0 success,
    1 a job that did not complete or an error, 2 bad usage, 130 interrupted: Ctrl-C or
    SIGTERM, both of which stop every process the command started). Called without
    ``argv`` (the console script, ``python -m batchclient.cli``) it ends the process itself
    (:func:`._signals.exit_now`: without the interpreter's teardown, 5-15 s once vLLM is
    imported)."""
    code = _main(argv)
    if argv is None:  # the command line itself: the process ends here
        exit_now(code)
    return code


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.func
    if getattr(args, "database", None):
        # every client and job manager the command makes reads it (the flag is the variable)
        os.environ[DATABASE_ENV] = args.database
    try:
        # SIGTERM stops a command as Ctrl-C does; engines get a short grace (the process
        # exits right after, and its resource tracker cleans what a killed engine leaves)
        with sigterm_as_interrupt(), quick_engine_stops():
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
