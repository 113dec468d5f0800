"""The options of ``batchclient bench`` (every one documented in ``docs/benchmarks.md`` and
README's Benchmark section), their checks, and the command line that reproduces a run."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from ...errors import ConfigurationError
from ._spec import ALL_MODES, ENGINE_MAX_NUM_SEQS, KV_CACHE_GIB


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``batchclient bench`` (documented in ``docs/benchmarks.md``)."""
    data = p.add_argument_group("data")
    data.add_argument("-n", type=int, default=256, help="conversations (default 256)")
    data.add_argument(
        "--seed", type=int, default=0, metavar="N", help="ShareGPT sampling seed (default 0)"
    )
    data.add_argument(
        "--max-tokens",
        type=int,
        default=256,
        metavar="N",
        help="cap on each request's output length; ShareGPT requests ask for their reference "
        "reply's length up to this (default 256)",
    )
    data.add_argument(
        "--input",
        type=Path,
        default=None,
        metavar="FILE",
        help="an OpenAI batch JSONL file instead of ShareGPT (its first -n lines)",
    )
    modes = p.add_argument_group("modes")
    modes.add_argument(
        "--modes",
        nargs="+",
        choices=ALL_MODES,
        default=list(ALL_MODES),
        metavar="MODE",
        help=f"modes to run, any of {', '.join(ALL_MODES)} (default all)",
    )
    modes.add_argument(
        "--max-concurrency",
        type=int,
        nargs="+",
        default=[ENGINE_MAX_NUM_SEQS],
        metavar="N",
        help=f"remote: requests in flight, several values make a sweep (default "
        f"{ENGINE_MAX_NUM_SEQS}, the engines' sequences per step)",
    )
    modes.add_argument(
        "--replicas",
        type=int,
        nargs="+",
        default=[1, 2],
        metavar="N",
        help="ray: engine replicas (Ray actors, each bound to its own share of the cores and "
        "given its share of the KV cache), one row per value (default 1 2)",
    )
    modes.add_argument(
        "--peer-max-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="openai-gather and litellm: requests in flight (default the largest "
        "--max-concurrency)",
    )
    modes.add_argument(
        "--sequential-n",
        type=int,
        default=None,
        metavar="N",
        help="sequential runs only the first N requests, a shortcut for quick runs (one at a "
        "time is slow); default every request, like the other modes",
    )
    modes.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="runs per mode; each row is the run with the median output tok/s (default 1)",
    )
    modes.add_argument(
        "--no-warmup", action="store_true", help="skip each run's warm-up requests (quick checks)"
    )
    modes.add_argument(
        "--run-timeout",
        type=float,
        default=3600.0,
        metavar="S",
        help="seconds one run may take; a run over it is killed and reported (default 3600)",
    )
    where = p.add_argument_group("server and model")
    where.add_argument(
        "--base-url",
        default=None,
        metavar="URL",
        help="an OpenAI-compatible server to use (API root ending in /v1); default: start the "
        "local vLLM server for the server modes and stop it before the engine modes",
    )
    where.add_argument(
        "--model",
        default=None,
        metavar="M",
        help="model directory or hub id for the engines and the started server (default: the "
        "bundled SmolLM2-135M-Instruct); another model needs --input",
    )
    where.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model name requests use (default smollm2 for the bundled model, else --model)",
    )
    where.add_argument(
        "--max-model-len",
        type=int,
        default=2048,
        metavar="N",
        help="context length of the engines and the started server, tokens (default 2048)",
    )
    where.add_argument(
        "--kv-cache-gib",
        type=int,
        default=KV_CACHE_GIB,
        metavar="GIB",
        help=f"KV cache of every engine the harness starts (server, inline, vllm-offline), GiB "
        f"(default {KV_CACHE_GIB})",
    )
    out = p.add_argument_group("output")
    out.add_argument(
        "--out",
        type=Path,
        default=Path("bench/results"),
        metavar="DIR",
        help="directory for the files (default bench/results)",
    )
    out.add_argument(
        "--name", default="bench", help="file stem: NAME.json, NAME.png, NAME.md (default bench)"
    )
    out.add_argument(
        "--update-doc",
        type=Path,
        default=None,
        metavar="DOC",
        help="also replace the generated block of this Markdown file (docs/benchmarks.md)",
    )
    out.add_argument(
        "--verbose",
        action="store_true",
        help="show everything the server and each run print, vLLM's INFO lines included "
        "(default: the harness's own lines, and the last lines of a run that failed; "
        "BATCHCLIENT_VERBOSE=1 does the same)",
    )
    out.add_argument(
        "--from-json",
        type=Path,
        default=None,
        metavar="FILE",
        help="run nothing: render a saved report again (table, chart, --update-doc)",
    )


def check_args(args: argparse.Namespace) -> None:
    for name in ("n", "max_tokens", "sequential_n", "repeat", "max_model_len", "kv_cache_gib"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigurationError(f"--{name.replace('_', '-')} must be >= 1")
    if any(c < 1 for c in args.max_concurrency) or (args.peer_max_concurrency or 1) < 1:
        raise ConfigurationError("concurrency values must be >= 1")
    if any(n < 1 for n in args.replicas):
        raise ConfigurationError("--replicas values must be >= 1")


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run, every figure-shaping option spelled out."""
    words = ["batchclient", "bench", "-n", str(args.n)]
    if args.input is not None:
        words += ["--input", str(args.input)]
    else:
        words += ["--seed", str(args.seed)]
    words += ["--max-tokens", str(args.max_tokens), "--modes", *args.modes]
    words += ["--max-concurrency", *map(str, args.max_concurrency)]
    if "ray" in args.modes:
        words += ["--replicas", *map(str, args.replicas)]
    if args.peer_max_concurrency is not None:
        words += ["--peer-max-concurrency", str(args.peer_max_concurrency)]
    if args.sequential_n is not None:
        words += ["--sequential-n", str(args.sequential_n)]
    words += ["--repeat", str(args.repeat)]
    for flag, value in (
        ("--base-url", args.base_url),
        ("--model", args.model),
        ("--served-model-name", args.served_model_name),
    ):
        if value is not None:
            words += [flag, str(value)]
    if args.max_model_len != 2048:
        words += ["--max-model-len", str(args.max_model_len)]
    if args.kv_cache_gib != KV_CACHE_GIB:
        words += ["--kv-cache-gib", str(args.kv_cache_gib)]
    if args.no_warmup:
        words.append("--no-warmup")
    return shlex.join(words)
