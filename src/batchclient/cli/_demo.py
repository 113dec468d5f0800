"""The main job (``make demo``): ShareGPT conversations through batchclient, on this machine.

Samples 200 conversations from ShareGPT V3 by vLLM's benchmark rules (fixed seed), starts the
real vLLM OpenAI server with the bundled SmolLM2-135M-Instruct, and runs them through
``RemoteBatchInference`` with ``--max-concurrency`` in flight (the remote provider's default,
256) and the first 16 one at a time (the "without batching" baseline); then, after the server
has stopped, through ``VLLMBatchInference`` (unless ``--no-inline``). Prints a table
(requests, output tokens, wall time, output tokens/s, speedup over one at a time) and writes
every answer to a JSONL file whose path it prints. vLLM shows only its warnings and errors
unless ``--verbose`` (or ``BATCHCLIENT_VERBOSE=1``).

    batchclient demo [-n 200] [--max-tokens 128] [--max-concurrency 256] [--no-inline]
                     [--out DIR] [--verbose]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import anyio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .._core.client import BatchClient
from .._options import add_flags, flag_values, resolve
from ..datasets import SharegptSample, sample_sharegpt
from ..inline import VLLMBatchInference
from ..remote import RemoteBatchInference, RemoteOptions
from ..testing import vllm_server
from ..types import BatchChatCompletionResponse, BatchProgress, SamplingParams


@dataclass
class ModeRun:
    mode: str
    requests: int
    output_tokens: int
    failed: int
    wall_s: float
    response: BatchChatCompletionResponse

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s else 0.0


def _params(samples: Sequence[SharegptSample], cap: int) -> list[SamplingParams]:
    # Output lengths from the reference replies (vLLM's benchmark rule), capped for a short demo.
    return [SamplingParams(max_tokens=min(s.output_tokens, cap)) for s in samples]


async def _run_remote(
    url: str,
    mode: str,
    samples: Sequence[SharegptSample],
    cap: int,
    options: RemoteOptions,
    console: Console,
) -> ModeRun:
    async with RemoteBatchInference(url, **options) as client:
        return await _run(client, mode, samples, cap, console)


async def _run_inline(
    samples: Sequence[SharegptSample], cap: int, console: Console, verbose: bool
) -> ModeRun:
    # The same model and context length as the server (vllm_server's defaults).
    async with VLLMBatchInference(max_model_len=2048, verbose=verbose) as client:
        return await _run(client, "inline", samples, cap, console)


async def _run(
    client: BatchClient,
    mode: str,
    samples: Sequence[SharegptSample],
    cap: int,
    console: Console,
) -> ModeRun:
    with Progress(
        TextColumn(f"[bold]{mode:<14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task(mode, total=len(samples), rate="")

        def progress(p: BatchProgress) -> None:
            bar.update(
                task,
                completed=p.done,
                rate=f"{p.output_tokens_per_s:6.0f} tok/s  failed {p.failed}",
            )

        started = time.perf_counter()
        response = await client.batch_chat_completion(
            "smollm2",
            [s.messages for s in samples],
            sampling_params=_params(samples, cap),
            progress=progress,
        )
        wall = time.perf_counter() - started
    tokens = sum(int(r.metric("completion_tokens") or 0) for r in response.batch)
    return ModeRun(mode, len(samples), tokens, len(response.errors), wall, response)


def _table(runs: list[ModeRun]) -> Table:
    baseline = next((r for r in runs if r.mode == "one at a time"), None)
    table = Table(title="batchclient on ShareGPT (SmolLM2-135M, this machine)")
    for col in ("mode", "requests", "failed", "output tokens", "wall s", "output tok/s", "speedup"):
        table.add_column(col, justify="left" if col == "mode" else "right", no_wrap=True)
    for run in runs:
        speedup = (
            f"{run.tokens_per_s / baseline.tokens_per_s:.1f}x"
            if baseline and baseline.tokens_per_s
            else "-"
        )
        table.add_row(
            run.mode,
            str(run.requests),
            str(run.failed),
            str(run.output_tokens),
            f"{run.wall_s:.1f}",
            f"{run.tokens_per_s:.0f}",
            speedup,
        )
    return table


def _write_answers(path: Path, samples: Sequence[SharegptSample], runs: list[ModeRun]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for run in runs:
            for i, (sample, item) in enumerate(zip(samples, run.response.batch, strict=False)):
                record = {
                    "mode": run.mode,
                    "index": i,
                    "sharegpt_id": sample.id,
                    "prompt_excerpt": sample.prompt[:120],
                    "answer": item.text if item.error is None else None,
                    "error": item.error.model_dump() if item.error else None,
                    "prompt_tokens": item.metric("prompt_tokens"),
                    "completion_tokens": item.metric("completion_tokens"),
                }
                out.write(json.dumps(record, ensure_ascii=False) + "\n")


async def _remote_runs(
    url: str, samples: Sequence[SharegptSample], args: argparse.Namespace, console: Console
) -> list[ModeRun]:
    given = cast(RemoteOptions, flag_values(args, "remote", RemoteOptions, args.provider_flags))
    mode = f"remote x{resolve(RemoteOptions, given, who='the demo')['max_concurrency']}"
    one = RemoteOptions(max_concurrency=1)
    return [
        await _run_remote(url, mode, samples, args.max_tokens, given, console),
        await _run_remote(
            url, "one at a time", samples[: args.sequential], args.max_tokens, one, console
        ),
    ]


def _main(args: argparse.Namespace) -> None:
    # The server is started and stopped outside the event loop, and each phase runs its own
    # loop: Ctrl-C or SIGTERM while the server starts (a blocking wait of about 45 s) then
    # interrupts at once, and stopping it never holds up an event loop.
    console = Console()
    console.print(f"Sampling {args.n} ShareGPT conversations (seed {args.seed}) ...")
    samples = sample_sharegpt(args.n, seed=args.seed)
    console.print("Starting the vLLM OpenAI server with the bundled SmolLM2-135M-Instruct ...")
    with vllm_server(verbose=args.verbose) as url:
        console.print(f"Server ready at {url}")
        runs = anyio.run(_remote_runs, url, samples, args, console)
    if args.inline:
        console.print("Server stopped. Starting the vLLM engine in this process (inline) ...")
        runs.append(anyio.run(_run_inline, samples, args.max_tokens, console, args.verbose))
    console.print(_table(runs))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "answers.jsonl"
    _write_answers(path, samples, runs)
    console.print(f"Every answer: {path.resolve()}")


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", type=int, default=200, help="conversations (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument(
        "--max-tokens", type=int, default=128, help="cap on output tokens per answer (default 128)"
    )
    # the remote provider's own flag (its default, its help)
    flags = add_flags(parser, [("remote", RemoteOptions)], only={"max_concurrency"})
    parser.set_defaults(provider_flags=flags)
    parser.add_argument(
        "--sequential", type=int, default=16, help="conversations run one at a time (default 16)"
    )
    parser.add_argument(
        "--no-inline",
        dest="inline",
        action="store_false",
        help="skip the inline (in-process vLLM engine) run",
    )
    parser.add_argument("--out", type=Path, default=Path("demo-output"), help="output folder")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show everything the server and the engine print (default: vLLM's warnings and "
        "errors only; BATCHCLIENT_VERBOSE=1 does the same)",
    )


def demo_command(args: argparse.Namespace) -> int:
    _main(args)
    return 0
