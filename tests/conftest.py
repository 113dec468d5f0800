"""Shared fixtures: the real vLLM OpenAI server and the real in-process vLLM engine, each
started once per test session.

Set ``BATCHCLIENT_TEST_BASE_URL`` (e.g. ``http://127.0.0.1:8000/v1``) to run the server tests
against a server that is already running (it must serve the bundled model as ``smollm2`` with
``--max-model-len 2048 --enable-auto-tool-choice --tool-call-parser hermes``, and
``--enable-tokenizer-info-endpoint`` for the scoring tests over its ``/tokenize``) instead of
starting one.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from batchclient import RayBatchInference, VLLMBatchInference
from batchclient.testing import StubServer, vllm_server
from capability_matrix import pytest_runtest_logreport, pytest_terminal_summary  # noqa: F401
from postgres_util import pg_url, postgres_server  # noqa: F401
from providers import Provider, inline_provider, remote_provider
from session_servers import SessionServers, publish_users, shared_url

# The session runs several engines at once (the server's, the in-process ones: inline,
# embeddings, Ray replicas). Each bound to every core by default, their OpenMP threads
# oversubscribe the cores; on vLLM's "auto" binding they all share the same one. So on a CPU
# build the server computes on the first core and this process's engines on the last one.
_CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
# the binding the user gave, kept aside before this module sets its own: pytest-xdist's workers
# inherit the environment of the main process, which imported this module first (reading
# VLLM_CPU_OMP_THREADS_BIND there put the server on the engines' core)
_GIVEN = os.environ.setdefault(
    "BATCHCLIENT_TEST_GIVEN_BINDING", os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")
)
SERVER_BINDING = _GIVEN or str(_CORES[0])
os.environ["VLLM_CPU_OMP_THREADS_BIND"] = _GIVEN or str(_CORES[-1])
# Ray's memory monitor weighs the whole machine, where this session's other engines and servers
# run beside the cluster, and kills a replica in the middle of its start when they peak (it
# reads as "a Ray replica failed to start"). The tests size every engine's KV cache themselves.
os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")

# Tests never read or write the user's state directory: a client without ``state_dir=`` keeps
# its jobs in one private folder per test process (and its children), whatever schema the
# user's own store is at.
os.environ["BATCHCLIENT_STATE_DIR"] = tempfile.mkdtemp(prefix="batchclient-tests-")

SLOW_IMPORTS = ("torch", "transformers", "vllm", "ray", "inspect_ai")
"""Libraries that take seconds to import. Every pytest-xdist worker collects every module, so
one imported at a module's top costs each worker those seconds in every run, even where the
tests that need it are deselected: tests import them where they use them."""
IMPORTED_AT_COLLECTION = pytest.StashKey[list[str]]()
"""Which of :data:`SLOW_IMPORTS` this process had imported when collection finished
(``test_layout.py`` checks it is none)."""


def pytest_collection_finish(session: pytest.Session) -> None:
    loaded = [name for name in SLOW_IMPORTS if name in sys.modules]
    session.config.stash[IMPORTED_AT_COLLECTION] = loaded
    publish_users(
        {
            "chat": [item.nodeid for item in session.items if _uses_chat_server(item)],
            "pooling": [item.nodeid for item in session.items if _uses_pooling_server(item)],
        }
    )


def _uses_chat_server(item: pytest.Item) -> bool:
    """Whether ``item`` may use the session's chat server (``vllm_url``): its fixtures
    name it, or a fixture asks for it by name (``provider``, ``float32_url``), or it is in
    the server group."""
    callspec = getattr(item, "callspec", None)
    remote = callspec is not None and callspec.params.get("provider") == "remote"
    fixtures = set(getattr(item, "fixturenames", ()))
    return remote or bool(fixtures & {"vllm_url", "float32_url"}) or _in_group(item) == SERVER_GROUP


def _uses_pooling_server(item: pytest.Item) -> bool:
    """Whether ``item`` may use the session's embedding server (``pooling_url``)."""
    return "pooling_url" in getattr(item, "fixturenames", ()) or _in_group(item) == POOLING_GROUP


SERVER_GROUP, ENGINE_GROUP, POOLING_GROUP = "vllm-server", "vllm-engine", "vllm-pooling"
"""The pytest-xdist groups of the ``server`` and ``engine`` tests. Under ``--dist loadgroup``
(``make test``) each runs in one worker, the three at once, and each worker starts the
session's engines its tests use once: the engine group has the tests on the in-process
generating engine and the Ray cluster, the pooling group those on the in-process embedding
engine, the server group the tests on the session's servers only and those that start their
own. Such a test takes no other group."""
_ENGINE_FIXTURES = frozenset({"inline_client", "float32_client", "ray_client"})
_ENGINE_CELLS = frozenset({"inline", "ray"})  # test_capabilities' providers


def _vllm_group(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    params: dict[str, Any] = callspec.params if callspec is not None else {}
    cell = params.get("cell")
    provider = cell[0] if isinstance(cell, tuple) else None
    fixtures = getattr(item, "fixturenames", ())
    if (
        _ENGINE_FIXTURES.intersection(fixtures)
        or params.get("provider") == "inline"  # the provider fixture's engine half
        or provider in _ENGINE_CELLS
    ):
        return ENGINE_GROUP
    if "pooling_client" in fixtures or provider == "inline-pooling":
        return POOLING_GROUP
    return SERVER_GROUP


def _on_ray(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    cell = callspec.params.get("cell") if callspec is not None else None
    on_cell = isinstance(cell, tuple) and cell[0] == "ray"  # test_capabilities' Ray cells
    return "ray_client" in getattr(item, "fixturenames", ()) or on_cell


def _in_group(item: pytest.Item) -> str | None:
    """The vLLM group of a ``server`` or ``engine`` test, else None."""
    on_vllm = item.get_closest_marker("server") or item.get_closest_marker("engine")
    return _vllm_group(item) if on_vllm else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = _in_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # the Ray tests last: their replicas compute on every core, which the server's tests hold
    # one of until they are done (a stable sort: every worker must collect the same order)
    items.sort(key=_on_ray)
    if config.getoption("loadgroup", default=False):
        _name_the_groups(items)


def _name_the_groups(items: list[pytest.Item]) -> None:
    """pytest-xdist 3.8 tells its scheduler a test's ``xdist_group`` by renaming the test
    (``<node id>@<group>``), which pytest 9.2 no longer sees: its node ids are structured
    (pytest-dev/pytest-xdist#1386), and the groups silently stop holding. The same rename, on
    the structured id (``test_layout.py`` checks that it reaches the scheduler)."""
    from _pytest.nodeid import NodeId

    for item in items:
        nodeid = item.nodeid
        if nodeid.rfind("@") > nodeid.rfind("]"):
            continue  # renamed by pytest-xdist itself
        groups = sorted(
            {
                str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                for m in item.iter_markers("xdist_group")
            }
        )
        for only in (SERVER_GROUP, ENGINE_GROUP, POOLING_GROUP):
            if only in groups:
                groups = [only]  # with the session's servers and engines, whatever else
        if groups:
            item._id = NodeId.parse(f"{nodeid}@{'_'.join(groups)}")


INLINE_MAX_CONCURRENCY = 48
"""The session engine's window: small enough that tests can see it bound the engine."""


@pytest.fixture(scope="module")
def stub(request: pytest.FixtureRequest) -> Iterator[StubServer]:
    """A loopback ``StubServer`` shared by the module's tests, built with the keyword arguments
    of the module's ``stub`` marker (``pytestmark = pytest.mark.stub(faults=[...])``), if any.
    Shared: a test that counts requests counts from what the stub had when it began."""
    marker = request.node.get_closest_marker("stub")
    with StubServer(**(marker.kwargs if marker else {})) as server:
        yield server


CHAT_SERVER: dict[str, Any] = {
    "max_model_len": 2048,
    "enable_auto_tool_choice": True,
    "tool_call_parser": "hermes",
    "enable_tokenizer_info_endpoint": True,
    # dev mode: POST /reset_prefix_cache, as the benchmark harness's server has it
    "env": {"VLLM_CPU_OMP_THREADS_BIND": SERVER_BINDING, "VLLM_SERVER_DEV_MODE": "1"},
}
"""The session's chat server (``vllm_url``)."""
POOLING_SERVER: dict[str, Any] = {
    "max_model_len": 1024,
    "runner": "pooling",
    "convert": "embed",
    "kv_cache_memory_bytes": 256 << 20,
    "env": {"VLLM_CPU_OMP_THREADS_BIND": SERVER_BINDING},
}
"""The session's embedding server (``pooling_url``)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shared-vllm-servers",
        action="store_true",
        help="start the session's vLLM servers once, in the main process, for every "
        "pytest-xdist worker (make test), instead of in each worker that uses them",
    )


_SERVERS = pytest.StashKey[SessionServers]()


def pytest_configure(config: pytest.Config) -> None:
    worker = hasattr(config, "workerinput")
    if worker or not config.getoption("shared_vllm_servers", default=False):
        return
    specs = {"pooling": POOLING_SERVER}
    if not os.environ.get("BATCHCLIENT_TEST_BASE_URL"):
        specs = {"chat": CHAT_SERVER, **specs}
    servers = SessionServers(specs)
    servers.start()  # before pytest-xdist starts the workers, which inherit where they are
    config.stash[_SERVERS] = servers
    config.pluginmanager.register(servers, "batchclient-session-servers")


def pytest_unconfigure(config: pytest.Config) -> None:
    servers = config.stash.get(_SERVERS, None)
    if servers is not None:
        servers.stop()


@pytest.fixture(scope="session")
def vllm_url() -> Iterator[str]:
    """Base URL (ending in ``/v1``) of a real vLLM server with the bundled model as ``smollm2``,
    ``max_model_len`` 2048, and tool calling on (``hermes``: the parser of ChatML-style
    ``<tool_call>`` answers; the bundled model's own template has no tool support, so ``auto``
    rarely calls, while a forced choice is enforced by the server's structured output)."""
    given = os.environ.get("BATCHCLIENT_TEST_BASE_URL")
    if given:
        yield given.rstrip("/")
        return
    yield from _server("chat", CHAT_SERVER)


@pytest.fixture(scope="session")
def pooling_url() -> Iterator[str]:
    """Base URL of a real vLLM server with the bundled model as an embedding model
    (``runner="pooling", convert="embed"``, ``max_model_len`` 1024, a 256 MiB KV cache)."""
    yield from _server("pooling", POOLING_SERVER)


def _server(name: str, spec: dict[str, Any]) -> Iterator[str]:
    """The session's shared server ``name`` (``--shared-vllm-servers``), else one of this
    process's own."""
    url = shared_url(name)
    if url is not None:
        yield url
        return
    with vllm_server(**spec) as url:
        yield url


@pytest.fixture(scope="session")
async def inline_client() -> AsyncIterator[VLLMBatchInference]:
    """An open ``VLLMBatchInference`` on the bundled model (``smollm2``, ``max_model_len``
    2048, a 1 GiB KV cache so it fits next to the server), shared by the whole session."""
    async with VLLMBatchInference(
        max_concurrency=INLINE_MAX_CONCURRENCY, kv_cache_memory_bytes=1 << 30
    ) as client:
        yield client


@pytest.fixture(scope="session")
async def pooling_client() -> AsyncIterator[VLLMBatchInference]:
    """An open embedding engine on the bundled model (``runner="pooling", convert="embed"``,
    ``max_model_len`` 1024, a 256 MiB KV cache), shared by the session."""
    async with VLLMBatchInference(
        runner="pooling",
        convert="embed",
        max_model_len=1024,
        max_concurrency=64,
        kv_cache_memory_bytes=256 << 20,
    ) as client:
        yield client


@pytest.fixture(scope="session")
async def ray_client(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RayBatchInference]:
    """``RayBatchInference`` on a local Ray cluster of three logical CPUs: two replicas of the
    bundled model (``max_model_len`` 1024, a 256 MiB KV cache each, ``max_concurrency`` 64), each
    bound to its own core, shared by the session (a cluster and its replicas take minutes to
    start on 2 busy cores). The third CPU is for the replica a test starts of its own (a pooling
    replica, or a ``batchclient run --provider ray`` process on this cluster). A test that kills
    a replica leaves the other one serving."""
    import ray

    # the replicas claim their cores themselves, which a binding inherited by the local Ray
    # would override; restored once they run, for the engines started after them
    pinned = os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    ray.init(num_cpus=3, include_dashboard=False, logging_level=logging.WARNING)
    try:
        async with RayBatchInference(
            replicas=2,
            kv_cache_memory_bytes=256 << 20,
            max_model_len=1024,
            max_concurrency=64,
            state_dir=tmp_path_factory.mktemp("ray"),
        ) as client:
            if pinned is not None:
                os.environ["VLLM_CPU_OMP_THREADS_BIND"] = pinned
                pinned = None
            yield client
    finally:
        ray.shutdown()
        if pinned is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = pinned


def computes_in_float32() -> bool:
    """Whether the session's server and inline engine compute in float32: their dtype is
    chosen by the hardware, float32 on a CPU without bfloat16 arithmetic."""
    from batchclient import _engine_defaults as defaults

    return defaults.choose_dtype(cpu=defaults.vllm_on_cpu()).value == "float32"


@pytest.fixture(scope="module")
def float32_client(request: pytest.FixtureRequest) -> VLLMBatchInference:
    """An open engine on the bundled model that computes in float32 (in bfloat16 a score's last
    bits move with how the engine batched it, so two ways of scoring cannot be compared
    exactly): the session's inline engine where it runs float32 already, else one of its own.
    Tests that change its provider's settings put them back."""
    name = "inline_client" if computes_in_float32() else "own_float32_client"
    client: VLLMBatchInference = request.getfixturevalue(name)
    return client


@pytest.fixture(scope="module")
async def own_float32_client() -> AsyncIterator[VLLMBatchInference]:
    """The float32 engine on a machine whose session engine runs bfloat16 (512 MiB KV cache),
    for one module: kept for the session, it left too little memory for the Ray replicas and
    servers started after it on a 24 GiB machine."""
    async with VLLMBatchInference(
        max_model_len=2048,
        dtype="float32",
        kv_cache_memory_bytes=512 << 20,
        max_concurrency=INLINE_MAX_CONCURRENCY,
    ) as client:
        yield client


@pytest.fixture(scope="module")
def float32_url(request: pytest.FixtureRequest) -> str:
    """Base URL of a real vLLM server that computes in float32 (see ``float32_client``): the
    session's server where it runs float32 already (one it started), else one of its own for
    the module (stopped after it: the engines and Ray replicas started later need the
    memory)."""
    shared = computes_in_float32() and not os.environ.get("BATCHCLIENT_TEST_BASE_URL")
    url: str = request.getfixturevalue("vllm_url" if shared else "own_float32_url")
    return url


@pytest.fixture(scope="module")
def own_float32_url() -> Iterator[str]:
    """The float32 server on a machine whose session server runs bfloat16."""
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    # it starts in the middle of the session, next to the session's servers and engines (and
    # Ray's): on 2 busy cores that has taken over 180 s, the default wait
    with vllm_server(max_model_len=2048, dtype="float32", env=env, startup_timeout_s=600) as url:
        yield url


@pytest.fixture(
    params=[
        pytest.param("remote", marks=pytest.mark.server),
        pytest.param("inline", marks=pytest.mark.engine),
    ]
)
def provider(request: pytest.FixtureRequest) -> Provider:
    """Each provider in turn: the real server (remote) and the session's engine (inline)."""
    if request.param == "remote":
        return remote_provider(request.getfixturevalue("vllm_url"))
    return inline_provider(request.getfixturevalue("inline_client"))
