"""The package's folders are the data path, and imports flow one way along it.

Three rules over the modules of ``src/batchclient`` (``docs/design.md`` draws the layers):

- **Layers**: every module has a layer; it may import only modules of its own layer or below.
  Imports inside functions count; imports under ``if TYPE_CHECKING:`` do not (they never run).
- **No cycle**: no chain of imports leads from a module back to itself, counting every import:
  at module level, inside functions and under ``if TYPE_CHECKING:``.
- **Private modules stay in their package**: a module whose dotted path has a private part
  (``_name``) belongs to the package that holds the first such part, and only modules inside
  that package import it, or a package that :data:`BUILDING_BLOCKS` allows (batchclient's
  own packages building on another's internals, which that package does not export: its
  ``__init__`` exports only what users call). The underscore packages and modules at the
  top (``_core``, ``_routing``, ``_tools``, ``_cpu``, ``_logs``, ``_version``) belong to the
  whole package, so any module may import them (the layers still apply), and ``cli._bench``
  belongs to ``cli``.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

import batchclient

ROOT = Path(batchclient.__file__).parent

LAYERS: list[tuple[str, int]] = [
    # (module or package prefix, layer): the longest matching prefix wins
    ("errors", 0),
    ("_logs", 0),
    ("_version", 0),
    ("_redact", 0),  # secrets out of URLs shown or stored: remote, batchapi
    ("_options", 1),  # options declared once: every provider, the registry, the CLI
    ("types", 1),
    ("_state", 1),  # SQLite for every store: opening, migrations
    ("_invalid", 1),  # validation errors in the caller's words: core, server
    ("models", 1),
    ("_engine_defaults", 1),  # every engine's hardware-chosen defaults: inline, server, Ray
    ("datasets", 2),
    ("protocol", 2),
    ("_core.request", 2),
    ("_cpu", 2),  # binds engine threads by _engine_defaults' rule
    ("_tools", 3),
    ("_routing", 3),  # the replica router and retry policy, shared by providers
    ("_core.checks", 3),
    ("_core.calls", 3),
    ("_core.prompt_tokens", 2),  # counts prompt tokens of any body: errors only
    ("_core.usage", 2),  # the token classes of an answer's usage: items, calls, jobs, metrics
    ("_core.ledger", 1),  # billing tiers, prompt-cache rules, price tables
    ("_core.encode", 4),
    ("_core.decode", 4),
    ("_core.scheduler", 5),
    ("_core.provider", 6),
    ("_core", 6),
    ("cache", 7),
    ("jobs", 7),
    ("_core.execution", 8),  # how a client runs calls and batches: live, or remote batches
    ("_core.client", 8),
    ("remote", 9),
    ("inline", 9),
    ("batchapi", 9),
    ("server", 10),  # over any provider and the jobs; no provider of its own
    ("testing", 11),
    ("distributed", 11),
    ("_registry", 12),  # provider names -> every provider above
    ("integrations", 13),
    ("cli", 14),
    ("", 15),  # the package's __init__
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> int:
    matches = [p for p, _ in LAYERS if p == "" or module == p or module.startswith(p + ".")]
    return dict(LAYERS)[max(matches, key=len)]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(
    path: Path, module: str, modules: set[str], *, type_checking: bool = False
) -> set[str]:
    """The batchclient modules ``module`` imports at run time (names relative to the package);
    with ``type_checking``, those under ``if TYPE_CHECKING:`` too."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module and node.module.startswith("batchclient"):
                target = node.module.removeprefix("batchclient").lstrip(".")
            else:
                target = None
            if target is not None:
                for alias in node.names:  # `from . import x` may import submodule x
                    sub = f"{target}.{alias.name}" if target else alias.name
                    found.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("batchclient."):
                    found.add(alias.name.removeprefix("batchclient."))
        for inner in ast.iter_child_nodes(node):
            visit(inner)

    visit(tree)
    found.discard(module)
    return found


@functools.cache
def graph(type_checking: bool = False) -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    names = set(modules)
    return {
        name: imports_of(path, name, names, type_checking=type_checking) & names
        for name, path in modules.items()
    }


def owner(module: str) -> str | None:
    """The package a private module belongs to (the parent of its first ``_`` part; ``""``
    is the whole package), or None for a module without a private part."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_"):
            return ".".join(parts[:i])
    return None


def inside(module: str, package: str) -> bool:
    return package == "" or module == package or module.startswith(package + ".")


def test_every_module_has_a_layer_and_imports_only_its_layer_or_below() -> None:
    wrong = [
        f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
        for a, targets in graph().items()
        for b in targets
        if layer(b) > layer(a)
    ]
    assert not wrong, "\n".join(sorted(wrong))


BUILDING_BLOCKS: dict[str, set[str]] = {
    # package -> the other packages that may import its private modules
    "jobs": {"_core", "batchapi", "server", "cli", "integrations"},  # the store, runner, lines
    "cache": {"_core", "jobs"},  # cache keys and the cached provider, under the jobs
    "inline": {"distributed"},  # Ray replicas declare the inline engine's options again
    "batchapi": {"cli"},  # the flavours' key variables and prices
    "server": {"cli"},  # the bind-address check of `serve`
    "testing": {"cli"},  # the benchmark's server and its process group
}
"""Private modules that batchclient's own packages build on: none of them is public (each
package's ``__init__`` exports only what users call), and this allow-list, not an export, is
what lets another package reach them."""


def allowed(importer: str, package: str) -> bool:
    return inside(importer, package) or any(
        inside(importer, user) for user in BUILDING_BLOCKS.get(package, ())
    )


def test_private_modules_are_imported_only_inside_their_package() -> None:
    wrong = [
        f"{a} imports {b} (private to {owner(b)})"
        for a, targets in graph(type_checking=True).items()
        for b in targets
        if (package := owner(b)) is not None and not allowed(a, package)
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_every_building_block_is_used() -> None:
    """An allow-list entry no import needs any more is removed, so the list stays the truth."""
    used = {
        (package, user)
        for a, targets in graph(type_checking=True).items()
        for b in targets
        if (package := owner(b)) and not inside(a, package)
        for user in BUILDING_BLOCKS.get(package, ())
        if inside(a, user)
    }
    listed = {(p, u) for p, users in BUILDING_BLOCKS.items() for u in users}
    assert listed == used, listed - used


def test_the_private_rule_catches_what_it_should() -> None:
    assert owner("jobs._store") == "jobs"
    assert owner("_core.request") == ""
    assert owner("cli._bench._run") == "cli"
    assert owner("integrations.lm_eval._model") == "integrations.lm_eval"
    assert owner("remote") is None
    assert not inside("batchapi._parts", "jobs")
    assert inside("jobs._runner", "jobs") and inside("jobs", "jobs")
    assert inside("distributed._provider", "")


def test_there_is_no_import_cycle() -> None:
    edges = graph(type_checking=True)
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            dfs(node)
    assert not cycles, "\n".join(cycles)


@pytest.mark.slow
@pytest.mark.parametrize(
    "module",
    [
        "batchclient",
        "batchclient.testing",
        "batchclient.cli",
        "batchclient.jobs",
        "batchclient.server",
        "batchclient.distributed",
        "batchclient.integrations.ray_data",
    ],
)
def test_public_modules_import_alone_without_vllm(module: str) -> None:
    """Each imports on its own in a fresh interpreter, and none pulls in vLLM or torch."""
    code = (
        f"import sys, {module}; "
        "bad = [m for m in ('vllm', 'torch', 'transformers', 'ray') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_test_folders_mirror_the_package() -> None:
    """Each folder of ``tests/`` (but the data in ``evals/``) is named after the subpackage of
    ``batchclient`` whose code its tests prove (``core`` for ``_core``, ``routing`` for
    ``_routing``)."""
    tests = Path(__file__).parent
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    packages = {p.name.lstrip("_") for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert folders - {"evals"} <= packages, sorted(folders - {"evals"} - packages)


def test_collecting_the_tests_imports_no_slow_library(pytestconfig: pytest.Config) -> None:
    """No test module imports torch, transformers, vLLM, Ray or inspect_ai at its top: every
    pytest-xdist worker collects every module, and pays each such import in every run."""
    from conftest import IMPORTED_AT_COLLECTION

    loaded = pytestconfig.stash[IMPORTED_AT_COLLECTION]
    assert loaded == [], f"import {', '.join(loaded)} inside the test or fixture that needs it"


@pytest.mark.xdist_group("torch")
def test_xdist_groups_reach_the_scheduler(request: pytest.FixtureRequest) -> None:
    """Under ``--dist loadgroup`` a grouped test's node id ends in its group, which is what
    pytest-xdist's scheduler groups by (``conftest.py`` names the groups where pytest-xdist's
    own renaming no longer takes)."""
    if not request.config.getoption("loadgroup", default=False):
        pytest.skip("runs under pytest-xdist's --dist loadgroup")
    assert request.node.nodeid.endswith("@torch"), request.node.nodeid
