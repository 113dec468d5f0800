"""The provider registry: a provider's name and options -> the provider, or its client.

One place knows the names (``remote``, ``vllm``, ``ray``, ``batch-api``, ``anthropic-batch``,
``gemini-batch``) and which classes and options they stand for; ``batchclient run``, ``serve``
and ``lm-eval`` (their ``--provider`` flags, and the provider flags derived from each entry's
options ``TypedDict``), ``batchclient providers`` (:meth:`ProviderEntry.describe`), the lm-eval
model (``provider=...``) and the benchmark build their providers here. Options are the
constructors' own keyword arguments (``base_url``, ``api_key``, ``model``, the provider's
options ``TypedDict``, engine arguments for ``vllm`` and ``ray``), checked by name before
anything is built: an unknown name or option is a ``ConfigurationError`` listing the known
ones. Nothing here starts a provider, and neither vLLM nor Ray is imported.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._core.client import BatchClient
from ._core.provider import Provider
from ._options import describe, is_declared
from .batchapi import (
    AnthropicBatchInference,
    AnthropicBatchOptions,
    BatchAPIBatchInference,
    BatchAPIOptions,
    GeminiBatchInference,
    GeminiBatchOptions,
    RemoteBatchProvider,
)
from .distributed import RayBatchInference, RayOptions, RayProvider
from .errors import ConfigurationError
from .inline import VLLMBatchInference, VLLMOptions, VLLMProvider
from .remote import RemoteBatchInference, RemoteOptions, RemoteProvider

__all__ = [
    "PROVIDERS",
    "ProviderEntry",
    "check_options",
    "entry_of",
    "make_client",
    "make_provider",
]


@dataclass(frozen=True)
class ProviderEntry:
    """One provider name: its provider and client classes and its options ``TypedDict``.
    ``engine_args``: other keyword options are vLLM engine arguments (checked when the engine
    starts); ``cache``: the client can keep a result cache."""

    name: str
    summary: str
    provider: Callable[..., Provider]
    client: Callable[..., BatchClient]
    options: type
    engine_args: bool = False
    cache: bool = True

    @property
    def option_names(self) -> list[str]:
        """The names ``options`` declares, in declaration order."""
        return list(self.options.__annotations__)

    def arguments(self, *, client: bool) -> dict[str, inspect.Parameter]:
        """The named arguments the provider (or the client) takes, ``state_dir`` and
        ``cache`` aside: its positional ones, its options and the client's own."""
        named: dict[str, inspect.Parameter] = {}
        for cls in (self.provider, self.client) if client else (self.provider,):
            for p in inspect.signature(cls).parameters.values():
                if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                    named.setdefault(p.name, p)
        named.pop("state_dir", None)
        named.pop("cache", None)
        for option in self.option_names:
            named.setdefault(
                option, inspect.Parameter(option, inspect.Parameter.KEYWORD_ONLY, default=None)
            )
        return named

    def describe(self) -> str:
        """What ``batchclient providers`` prints for this name: its summary, the arguments of
        its client, and each option with its default and help."""
        named = self.arguments(client=True)
        shown = [
            n + (" (required)" if p.default is inspect.Parameter.empty else "")
            for n, p in named.items()
            if n not in self.option_names
        ]
        lines = [f"{self.name}: {self.summary}", f"    arguments: {', '.join(shown)}"]
        if is_declared(self.options):
            lines += ["    options:", describe(self.options)]
        else:
            lines.append(f"    options: {', '.join(self.option_names)}")
        if self.engine_args:
            lines.append("    any other option: a vLLM engine argument (AsyncEngineArgs)")
        return "\n".join(lines)


PROVIDERS: dict[str, ProviderEntry] = {
    entry.name: entry
    for entry in (
        ProviderEntry(
            "remote",
            "live fan-out to OpenAI-compatible servers (base_url)",
            RemoteProvider,
            RemoteBatchInference,
            RemoteOptions,
        ),
        ProviderEntry(
            "vllm",
            "a vLLM engine in this process",
            VLLMProvider,
            VLLMBatchInference,
            VLLMOptions,
            engine_args=True,
        ),
        ProviderEntry(
            "ray",
            "vLLM engine replicas as Ray actors",
            RayProvider,
            RayBatchInference,
            RayOptions,
            engine_args=True,
        ),
        ProviderEntry(
            "batch-api",
            "a remote OpenAI Batch API (/v1/files + /v1/batches; base_url)",
            RemoteBatchProvider.batch_api,
            BatchAPIBatchInference,
            BatchAPIOptions,
            cache=False,
        ),
        ProviderEntry(
            "anthropic-batch",
            "Anthropic Message Batches (api_key or $ANTHROPIC_API_KEY; base_url optional)",
            RemoteBatchProvider.anthropic,
            AnthropicBatchInference,
            AnthropicBatchOptions,
            cache=False,
        ),
        ProviderEntry(
            "gemini-batch",
            "Gemini Batch API (api_key or $GEMINI_API_KEY / $GOOGLE_API_KEY; base_url optional)",
            RemoteBatchProvider.gemini,
            GeminiBatchInference,
            GeminiBatchOptions,
            cache=False,
        ),
    )
}
"""Every provider name, in the order the CLI lists them."""


def entry_of(name: str) -> ProviderEntry:
    """The registry's entry for ``name``; ``ConfigurationError`` listing the known names."""
    entry = PROVIDERS.get(name)
    if entry is None:
        raise ConfigurationError(
            f"unknown provider {name!r}: the providers are {', '.join(PROVIDERS)}"
        )
    return entry


def check_options(name: str, options: dict[str, Any], *, client: bool) -> None:
    """Raise ``ConfigurationError`` unless ``options`` name only what the provider called
    ``name`` (with ``client``: or its client) takes, and every argument it needs."""
    entry = entry_of(name)
    named = entry.arguments(client=client)
    missing = [
        n for n, p in named.items() if p.default is inspect.Parameter.empty and n not in options
    ]
    if missing:
        raise ConfigurationError(f"provider {entry.name!r} needs {', '.join(missing)}")
    unknown = sorted(set(options) - set(named))
    if unknown and not entry.engine_args:
        raise ConfigurationError(
            f"provider {entry.name!r} takes no option {', '.join(unknown)}; its options are "
            f"{', '.join(named)}"
        )


def make_provider(name: str, /, **options: Any) -> Provider:
    """The provider called ``name`` (see :data:`PROVIDERS`), built with ``options`` (not
    started).

    Raises:
        ConfigurationError: an unknown name or option, a missing one (``base_url`` for
            ``remote`` and ``batch-api``), or an option the provider refuses.
    """
    entry = entry_of(name)
    check_options(name, options, client=False)
    return entry.provider(**options)


def make_client(
    name: str,
    /,
    *,
    state_dir: str | os.PathLike[str] | None = None,
    cache: bool = False,
    **options: Any,
) -> BatchClient:
    """The client of the provider called ``name`` (``RemoteBatchInference``, ...), built with
    ``options``, ``state_dir`` and ``cache`` (not opened).

    Raises:
        ConfigurationError: as :func:`make_provider`, or ``cache=True`` for ``batch-api``
            (a repeated call re-attaches to its remote batches instead).
    """
    entry = entry_of(name)
    check_options(name, options, client=True)
    if not entry.cache:
        if cache:
            raise ConfigurationError(
                f"the result cache is not available with provider {name!r} (running the same "
                "call or file again re-attaches to its remote batches instead)"
            )
        return entry.client(state_dir=state_dir, **options)
    return entry.client(state_dir=state_dir, cache=cache, **options)
