"""Wrapper providers hand every member of the ``Provider`` interface to the provider they wrap,
except the members they exist to change, and keep doing so when a hook is added to
``Provider``: the members are enumerated from the class, not listed here."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import batchclient
from batchclient import BatchChatCompletionResponse, DelegatingProvider, Endpoint, Provider, Request
from batchclient._core.responses import ResponsesOverChat
from batchclient.cache import ResultCache
from batchclient.cache._provider import CachedProvider
from batchclient.remote import RemoteProvider
from batchclient.server import create_app
from batchclient.server._metrics import MeteredProvider, Metrics
from batchclient.server._tenants import SharedProvider
from batchclient.testing import AppServer, StubServer

SRC = Path(batchclient.__file__).parent

MEMBERS = sorted(name for name in dir(Provider) if not name.startswith("_"))
"""Every public member of the interface: its methods and ``endpoints``."""

ARGUMENTS: dict[str, Any] = {
    "request": Request(index=7, body={"model": "m-1", "messages": []}),
    "model": "m-1",
}
"""What each hook is called with, by parameter name (a hook with a new parameter name fails
``test_every_member_reaches_inner`` until it is given one here)."""

OVERRIDES: dict[type[Provider], set[str]] = {
    DelegatingProvider: set(),
    SharedProvider: {"start", "stop", "execute", "max_in_flight"},  # started once; the fair gate
    CachedProvider: {"execute"},  # answers from the cache first
    MeteredProvider: {"execute"},  # counts each request in the server's metrics
    ResponsesOverChat: {"endpoints", "execute"},  # /v1/responses requests run as chat
}
"""Every wrapper provider of the package, and the members it documents as its own."""


class Mark:
    """The distinctive value one hook of the recording provider returns."""

    def __init__(self, member: str) -> None:
        self.member = member

    def __repr__(self) -> str:
        return f"Mark({self.member})"


def _hook(name: str) -> Callable[..., Any]:
    def hook(self: Any, *args: Any) -> Any:
        self.calls.append((name, args))
        return self.marks[name]

    return hook


def _async_hook(name: str) -> Callable[..., Any]:
    async def hook(self: Any, *args: Any) -> Any:
        self.calls.append((name, args))
        return self.marks[name]

    return hook


def recording_provider() -> Any:
    """A provider whose every hook records its call and returns its own :class:`Mark`, made
    from ``Provider``'s members (a hook added to ``Provider`` is recorded too)."""
    namespace: dict[str, Any] = {}
    for name in MEMBERS:
        member = getattr(Provider, name)
        if not callable(member):
            continue
        namespace[name] = _async_hook(name) if inspect.iscoroutinefunction(member) else _hook(name)
    recording = type("Recording", (Provider,), namespace)()
    recording.calls = []
    recording.marks = {name: Mark(name) for name in MEMBERS}
    recording.endpoints = frozenset({Endpoint.embeddings})
    return recording


def wrap(cls: type[Provider], inner: Provider, tmp_path: Path) -> Provider:
    if cls is CachedProvider:
        return CachedProvider(inner, ResultCache(tmp_path / "cache.sqlite3"))
    if cls is MeteredProvider:
        return MeteredProvider(inner, Metrics())
    factory: Callable[[Provider], Provider] = cls  # type: ignore[assignment]
    return factory(inner)


def wrapper_classes_in_source() -> set[str]:
    """The names of the provider classes in ``src/batchclient`` that wrap another provider:
    subclasses of ``DelegatingProvider``, and providers taking a ``Provider`` in their
    constructor."""
    found = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [ast.unparse(base) for base in node.bases]
            if not any("Provider" in base for base in bases):
                continue
            if any(base.endswith("DelegatingProvider") for base in bases):
                found.add(node.name)
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    arguments = item.args.posonlyargs + item.args.args + item.args.kwonlyargs
                    annotations = [ast.unparse(a.annotation) for a in arguments if a.annotation]
                    if any("Provider" in a for a in annotations):
                        found.add(node.name)
    return found


def test_every_wrapper_provider_of_the_package_is_checked_here() -> None:
    assert wrapper_classes_in_source() == {c.__name__ for c in OVERRIDES}
    for cls in OVERRIDES:
        assert issubclass(cls, DelegatingProvider)


@pytest.mark.parametrize("cls", list(OVERRIDES), ids=lambda c: c.__name__)
def test_a_wrapper_overrides_only_what_it_documents(cls: type[Provider]) -> None:
    own = {
        name
        for name in MEMBERS
        for klass in cls.__mro__[: cls.__mro__.index(DelegatingProvider)]
        if name in vars(klass)
    }
    assert own == OVERRIDES[cls]


@pytest.mark.parametrize("cls", list(OVERRIDES), ids=lambda c: c.__name__)
async def test_every_member_reaches_inner(cls: type[Provider], tmp_path: Path) -> None:
    assert {"endpoints", "execute", "cache_identity", "tokenizer"} <= set(MEMBERS)
    inner = recording_provider()
    wrapper = wrap(cls, inner, tmp_path)
    for name in MEMBERS:
        if name in OVERRIDES[cls]:
            continue
        member = getattr(Provider, name)
        if not callable(member):
            assert getattr(wrapper, name) is getattr(inner, name), name
            continue
        parameters = list(inspect.signature(member).parameters)[1:]
        missing = [p for p in parameters if p not in ARGUMENTS]
        assert not missing, f"give Provider.{name}'s parameters {missing} a value in ARGUMENTS"
        args = tuple(ARGUMENTS[p] for p in parameters)
        inner.calls.clear()
        answer = getattr(wrapper, name)(*args)
        if inspect.isawaitable(answer):
            answer = await answer
        assert inner.calls == [(name, args)], f"{cls.__name__}.{name} did not reach inner"
        if inspect.signature(member).return_annotation != "None":
            assert answer is inner.marks[name], f"{cls.__name__}.{name} changed the answer"


@pytest.mark.parametrize("cls", list(OVERRIDES), ids=lambda c: c.__name__)
def test_endpoints_are_read_from_inner_when_asked(cls: type[Provider], tmp_path: Path) -> None:
    inner = recording_provider()
    wrapper = wrap(cls, inner, tmp_path)
    inner.endpoints = frozenset({Endpoint.completions})  # as the inline engine does on start
    assert wrapper.endpoints == frozenset({Endpoint.completions})


async def test_shared_provider_leaves_start_and_stop_to_the_server(tmp_path: Path) -> None:
    inner = recording_provider()
    shared = SharedProvider(inner)
    async with shared:
        pass
    assert inner.calls == []


# ------------------------------------------------------------------------------ serve --cache


def _ask(url: str) -> Any:
    body = {
        "model": "smollm2",
        "messages_batch": [[{"role": "user", "content": "which weights?"}]],
        "sampling_params": {"max_tokens": 8},
    }
    response = httpx.post(f"{url}/batch-inference/chat-completion", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return BatchChatCompletionResponse.model_validate(response.json()).batch[0]


def test_serve_with_cache_keys_answers_by_the_weights_the_upstream_reports(
    tmp_path: Path,
) -> None:
    """``batchclient serve --cache``: an answer is reused only while the upstream reports the
    same weights (``/v1/models``' ``root``) for the model, as a client's own cache does."""

    def serve_once(stub: StubServer) -> Any:
        app = create_app(RemoteProvider(stub.url), state_dir=tmp_path, cache=True)
        with AppServer(app) as url:
            return _ask(url)

    with StubServer(model_info={"root": "/models/v1"}) as stub:
        first = serve_once(stub)
        stub.model_info = {"root": "/models/v2"}  # the upstream now serves other weights
        swapped = serve_once(stub)
        stub.model_info = {"root": "/models/v1"}
        back = serve_once(stub)
        assert stub.stats.requests == 2
    assert first.error is None and swapped.error is None and back.error is None
    assert [item.cached for item in (first, swapped, back)] == [False, False, True]
