"""The provider flags of ``run``, ``serve`` and ``lm-eval``, and ``batchclient providers``.

``--provider`` names a registry entry; ``--base-url``, the API key flag, ``--model`` and
``--engine-arg`` give what a provider takes before its options (its URL or model, its key,
vLLM engine arguments); every other provider flag is derived from the entries' options
``TypedDict`` (:func:`batchclient._options.add_flags`): one flag per option, whose help names
the providers that take it and each one's default. A flag not given is not passed, so the
provider's own default applies; a flag the chosen provider does not take is refused.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
from typing import Any

from .. import _registry as registry
from .._core.client import BatchClient
from .._core.provider import Provider
from .._options import Flags, add_flags, flag_values, specs
from ..batchapi._flavors import flavor_of
from ..errors import ConfigurationError

__all__ = [
    "add_option_flags",
    "add_provider_arguments",
    "entries",
    "given_options",
    "key_values",
    "make_client",
    "make_provider",
    "provider_options",
    "providers_command",
]

OPTIONS_GROUP = (
    "provider options",
    "Each flag names the providers that take it, with their defaults; a flag that is not given "
    "leaves the provider's own default, and one the chosen --provider does not take is refused.",
)


def entries(*, batch_api: bool) -> list[registry.ProviderEntry]:
    """The registry's entries a command offers: all, or (``batch_api`` False) those that run
    one request at a time (the batch providers run whole files: ``run`` only)."""
    return [e for e in registry.PROVIDERS.values() if batch_api or e.cache]


def add_option_flags(
    p: argparse.ArgumentParser, offered: list[registry.ProviderEntry], *, own: set[str]
) -> Flags:
    """One flag per option of ``offered``'s options (``own``: names the command gives flags
    of its own), in a group of their own; the flags are kept in the namespace for
    :func:`given_options`."""
    group = p.add_argument_group(*OPTIONS_GROUP)
    pairs = [(e.name, e.options) for e in offered]
    names = {n for _, t in pairs for n in specs(t)} - own
    flags = add_flags(group, pairs, only=names)
    p.set_defaults(provider_flags=flags)
    return flags


def given_options(args: argparse.Namespace, entry: registry.ProviderEntry) -> dict[str, Any]:
    """The options the flags give ``entry`` (only those given), under its option names.
    Raises ``ConfigurationError`` for a flag it does not take."""
    return flag_values(args, entry.name, entry.options, args.provider_flags)


def add_provider_arguments(
    p: argparse.ArgumentParser, *, api_key_flag: str, batch_api: bool = False
) -> None:
    """``--provider`` and its flags (``run`` and ``serve`` share them; :func:`make_provider`
    builds it); ``api_key_flag`` names the flag of the key sent upstream (``serve`` keeps
    ``--api-key`` for its own keys). ``batch_api`` offers the batch providers too (``run``
    only: they run whole files, not the one request at a time a server would send)."""
    offered = entries(batch_api=batch_api)
    p.add_argument(
        "--provider",
        choices=[e.name for e in offered],
        default="remote",
        help="; ".join(f"{e.name}: {e.summary}" for e in offered),
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
    p.add_argument("--model", default=None, help="vllm, ray: model path or name (default: bundled)")
    p.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="vllm, ray: an engine argument (value parsed as JSON if it can be), repeatable",
    )
    p.add_argument(
        "--cache",
        action="store_true",
        help="answer from the result cache in the state directory and fill it (successes only)",
    )
    # ``run``: --completion-window is the job's, and --tokenizer the dry run's
    add_option_flags(p, offered, own={"completion_window", "tokenizer"})


def provider_options(args: argparse.Namespace) -> dict[str, Any]:
    """The registry options (:func:`batchclient._registry.make_client`) the flags of
    :func:`add_provider_arguments` give ``--provider``: only the flags given (the provider's
    own defaults otherwise).

    Raises:
        ConfigurationError: a flag the provider does not take, or a missing ``--base-url``.
    """
    entry = registry.entry_of(args.provider)
    options = given_options(args, entry)
    named = entry.arguments(client=True)
    if "base_url" in named:
        options.update(_connection(args, entry, named["base_url"], options.get("flavor")))
    elif args.base_url or args.upstream_api_key:
        raise ConfigurationError(f"--base-url and the API key are not for provider {entry.name!r}")
    engine_args = key_values(args.engine_arg, "--engine-arg")
    if "model" in named:
        if args.model is not None:
            options["model"] = args.model
    elif args.model is not None:
        raise ConfigurationError(
            f"--model does not apply to provider {entry.name!r} (each request names its model)"
        )
    if engine_args and not entry.engine_args:
        raise ConfigurationError(f"--engine-arg does not apply to provider {entry.name!r}")
    taken = sorted(set(engine_args) & ({"model"} | set(entry.option_names)))
    if taken:
        raise ConfigurationError(
            f"--engine-arg {', '.join(taken)}: give these with their own flags"
        )
    return {**options, **engine_args}


def _connection(
    args: argparse.Namespace,
    entry: registry.ProviderEntry,
    base_url: inspect.Parameter,
    flavor: str | None,
) -> dict[str, Any]:
    """``base_url`` and ``api_key`` for a provider that takes them. An OpenAI-shaped one
    (``base_url`` required) gets the key of its host's variable; the others read their own
    variables (a dry run sends nothing, so it needs no key)."""
    if base_url.default is inspect.Parameter.empty:
        if not args.base_url:
            raise ConfigurationError(f"--provider {entry.name} needs --base-url")
        key = args.upstream_api_key or os.environ.get(_key_variable(flavor, args.base_url))
        return {"base_url": args.base_url, "api_key": key}
    key = args.upstream_api_key
    if getattr(args, "dry_run", False) and not key:
        key = "unused-by-dry-run"
    return {"base_url": args.base_url, "api_key": key}


def _key_variable(flavor: str | None, base_url: str) -> str:
    """The environment variable holding the key for a flavour (named, or read from the URL):
    an OpenAI key is never sent to another provider's host."""
    name = flavor_of(flavor, base_url or "").name
    return f"{name.upper()}_API_KEY"


def key_values(items: list[str], flag: str) -> dict[str, Any]:
    """``KEY=VALUE`` words as a dict, each value parsed as JSON when it is JSON."""
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


def make_provider(args: argparse.Namespace) -> Provider:
    """The provider the flags of :func:`add_provider_arguments` describe (not started), from
    the provider registry. Raises ``ConfigurationError`` for flags that do not fit
    together."""
    return registry.make_provider(args.provider, **provider_options(args))


def make_client(args: argparse.Namespace, **extra: Any) -> BatchClient:
    """The registry's client of ``--provider`` with ``--state-dir`` and ``--cache``
    (``batch-api``: :class:`~batchclient.BatchAPIBatchInference`, which runs whole jobs);
    ``extra``: options the command gives itself."""
    return registry.make_client(
        args.provider,
        state_dir=getattr(args, "state_dir", None),
        cache=getattr(args, "cache", False),
        **provider_options(args),
        **extra,
    )


def add_providers_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "name",
        nargs="?",
        choices=list(registry.PROVIDERS),
        help="one provider (default: every one)",
    )


def providers_command(args: argparse.Namespace) -> int:
    """Print each provider's arguments and options, with their defaults."""
    names = [args.name] if args.name else list(registry.PROVIDERS)
    print("\n\n".join(registry.PROVIDERS[n].describe() for n in names))
    return 0
