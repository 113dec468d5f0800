"""The client behind the lm-eval model, and calling it from lm-eval's synchronous code.

lm-eval calls a model from plain threads; batchclient's clients are async. A
:class:`ClientSession` either owns a client, opened on first use on an event loop in a
background thread (an anyio blocking portal) and closed by :meth:`ClientSession.close`, or
borrows one already open on the caller's loop, which lm-eval must then call from a worker thread
of that loop (``anyio.to_thread.run_sync``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio.from_thread

from ... import _registry as registry
from ..._core.client import BatchClient
from ...errors import ConfigurationError
from ...types import Endpoint

__all__ = ["ClientSession", "client_factory", "remote_base"]


def remote_base(url: str) -> str:
    """An API root ending in ``/v1`` from what users of lm-eval's ``local-completions`` give
    (``.../v1/completions`` or ``.../v1/chat/completions``)."""
    url = url.rstrip("/")
    for endpoint in (Endpoint.chat_completions, Endpoint.completions):
        url = url.removesuffix(endpoint.path)
    return url


def client_factory(
    provider: str,
    model: str | None,
    *,
    base_url: str | None,
    api_key: str | None,
    tokenizer: str | None,
    max_concurrency: int | None,
    timeout: float,
    max_retries: int,
    state_dir: Path,
    engine_args: dict[str, Any],
) -> Callable[[], BatchClient]:
    """A function that builds the client the model's arguments describe, from the provider
    registry (checked now, built later, on the client's event loop). ``engine_args``: the
    other ``model_args``, the provider's own options (vLLM engine arguments for ``vllm`` and
    ``ray``; ``rpm``, ``adaptive``, ... for ``remote``). Raises ``ConfigurationError`` for an
    unknown provider or arguments that do not fit it."""
    registry.entry_of(provider)  # an unknown name: the error lists the known ones
    options: dict[str, Any]
    if provider in ("remote", "batch-api"):
        if not base_url or not model:
            raise ConfigurationError(f"provider={provider} needs base_url=... and model=...")
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        options = {"base_url": remote_base(base_url), "api_key": key or None}
        timeout_name = "timeout" if provider == "remote" else "timeout_s"
        options.update({timeout_name: float(timeout)}, max_retries=int(max_retries))
        options["tokenizer"] = tokenizer  # scoring text, and chat templates
    elif provider in ("anthropic-batch", "gemini-batch"):
        # chat only (completions and scoring calls are refused with the endpoint's name);
        # their own default hosts and key variables, which the client reads
        if not model:
            raise ConfigurationError(f"provider={provider} needs model=...")
        if tokenizer:
            raise ConfigurationError(
                f"tokenizer is for provider=remote or batch-api: {provider} cannot score"
            )
        options = {"base_url": base_url or None, "api_key": api_key or None}
        options.update(timeout_s=float(timeout), max_retries=int(max_retries))
    else:
        if base_url or tokenizer:
            raise ConfigurationError("base_url and tokenizer are for provider=remote or batch-api")
        options = {"model": model}
    if max_concurrency:
        options["max_concurrency"] = int(max_concurrency)
    taken = sorted(set(engine_args) & set(options))
    if taken:
        raise ConfigurationError(f"{', '.join(taken)}: given twice")
    options.update(engine_args)
    registry.check_options(provider, options, client=True)
    return lambda: registry.make_client(provider, state_dir=state_dir, **options)


class ClientSession:
    """A client to call from synchronous code: built by ``make`` and owned, or ``borrowed``."""

    def __init__(
        self,
        make: Callable[[], BatchClient] | None = None,
        borrowed: BatchClient | None = None,
    ) -> None:
        if (make is None) == (borrowed is None):
            raise ValueError("give make or borrowed")
        self._make = make
        self._borrowed = borrowed
        self._stack: contextlib.ExitStack | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._client: BatchClient | None = None

    @property
    def client(self) -> BatchClient:
        """The open client (opened now if it is owned and not open yet)."""
        return self._borrowed if self._borrowed is not None else self._open()[1]

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` (async) on the client's event loop; return its result."""
        if self._borrowed is not None:
            return anyio.from_thread.run(fn, *args)
        portal, _ = self._open()
        return portal.call(fn, *args)

    def _open(self) -> tuple[anyio.from_thread.BlockingPortal, BatchClient]:
        if self._portal is not None and self._client is not None:
            return self._portal, self._client
        assert self._make is not None
        stack = contextlib.ExitStack()
        try:
            portal = stack.enter_context(anyio.from_thread.start_blocking_portal())
            client = portal.call(self._make)
            stack.enter_context(portal.wrap_async_context_manager(client))
        except BaseException:
            stack.close()
            raise
        self._stack, self._portal, self._client = stack, portal, client
        return portal, client

    def close(self) -> None:
        """Close an owned client (an inline engine is shut down); a borrowed one stays open."""
        stack, self._stack = self._stack, None
        self._portal = self._client = None
        if stack is not None:
            stack.close()
