"""``batchclient lm-eval``: lm-evaluation-harness with ``--model batchclient`` built from this
command's options; everything after ``--`` goes to lm-eval unchanged (guide: ``docs/evals.md``).

    batchclient lm-eval --provider remote --base-url URL --model NAME [--tokenizer DIR] \\
        -- --tasks TASKS [--include_path DIR] [--limit N] [--apply_chat_template] ...
    batchclient lm-eval --provider batch-api --base-url URL --model NAME --tokenizer DIR -- ...
    batchclient lm-eval --provider vllm [--model DIR] [--engine-arg KEY=VALUE ...] -- ...
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .. import _registry as registry
from ..errors import ConfigurationError
from ._providers import add_option_flags, entries, given_options


def add_lm_eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--provider",
        choices=list(registry.PROVIDERS),
        default="vllm",
        help="vllm: an engine in this process (default); remote: an OpenAI-compatible server; "
        "ray: engine replicas on Ray; batch-api: a remote Batch API (--tokenizer to score "
        "text); anthropic-batch, "
        "gemini-batch: refused (chat only; lm-eval's requests need /v1/completions)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="remote, batch-api: the served model name (required); vllm: model folder or hub id "
        "(default: the bundled SmolLM2-135M-Instruct)",
    )
    p.add_argument("--base-url", help="remote, batch-api: API root ending in /v1")
    p.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY"),
        help="remote: bearer token (default $OPENAI_API_KEY)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="remote, batch-api: local folder with the model's tokenizer files (chat templates "
        "need it; remote without it scores through the server's /tokenize; batch-api needs it "
        "to score text)",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="keep no answers (default: answers are kept in the state directory and a re-run "
        "sends only what is missing)",
    )
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="vllm: an engine argument (e.g. max_model_len=2048), repeatable",
    )
    add_option_flags(p, entries(batch_api=True), own={"tokenizer"})
    p.add_argument(
        "lm_eval_args",
        nargs="*",
        metavar="-- LM_EVAL_ARGS",
        help="lm-eval's own arguments after -- (--tasks, --include_path, --limit, ...)",
    )


def model_args(args: argparse.Namespace) -> str:
    """The ``--model_args`` string for ``BatchClientLM`` (``key=value,...``): its own
    arguments, then the provider options given as flags and the engine arguments (lm-eval
    reads each value back as a bool, None, number or text).

    Raises:
        ConfigurationError: a flag the provider does not take, or a value lm-eval's
            ``--model_args`` cannot hold.
    """
    values: dict[str, Any] = {"provider": args.provider}
    for key in ("model", "base_url", "tokenizer"):
        value = getattr(args, key)
        if value is not None:
            values[key] = value
    state_dir = getattr(args, "state_dir", None)
    if state_dir is not None:
        values["state_dir"] = state_dir
    if args.no_cache:
        values["cache"] = False
    values.update(given_options(args, registry.entry_of(args.provider)))
    for item in args.engine_arg:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigurationError(f"--engine-arg {item!r} is not KEY=VALUE")
        if key in values:
            raise ConfigurationError(f"--engine-arg {key}: give it with its own flag")
        values[key] = value
    for key, value in values.items():
        if "," in str(value) or "=" in str(value):
            raise ConfigurationError(
                f"{key}={value!r}: lm-eval's --model_args cannot hold ',' or '='"
            )
    return ",".join(f"{k}={v}" for k, v in values.items())


def lm_eval_command(args: argparse.Namespace) -> int:
    rest = list(args.lm_eval_args)
    for flag in ("--model", "--model_args"):
        if flag in rest or any(a.startswith(flag + "=") for a in rest):
            raise ConfigurationError(
                f"{flag} is set by batchclient lm-eval; give the model's options before `--`"
            )
    if args.provider in ("anthropic-batch", "gemini-batch"):  # before lm-eval loads its tasks
        raise ConfigurationError(
            f"lm-eval's requests (generate_until, loglikelihood) go to /v1/completions, which "
            f"--provider {args.provider} does not serve (chat only)"
        )
    if args.api_key:  # never on the command line: the model reads it from the environment
        os.environ["OPENAI_API_KEY"] = args.api_key
    try:
        from ..integrations.lm_eval import run_lm_eval
    except ImportError as exc:
        raise ConfigurationError(str(exc)) from exc

    argv = ["run", "--model", "batchclient", "--model_args", model_args(args), *rest]
    return run_lm_eval(argv)
