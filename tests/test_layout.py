"""The package's folders are the data path, and imports flow one way along it.

Every module of ``src/batchclient`` has a layer; a module may import only modules of its own
layer or below, and there is no import cycle at all. Imports inside functions count; imports
under ``if TYPE_CHECKING:`` do not (they never run). ``docs/design.md`` draws the layers.
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
    ("types", 1),
    ("models", 1),
    ("datasets", 2),
    ("protocol", 2),
    ("_core.request", 2),
    ("_tools", 3),
    ("_core.checks", 3),
    ("_core.encode", 4),
    ("_core.decode", 4),
    ("_core.scheduler", 5),
    ("_core.provider", 6),
    ("_core", 6),
    ("cache", 7),
    ("jobs", 7),
    ("_core.client", 8),
    ("remote", 9),
    ("inline", 9),
    ("batchapi", 9),
    ("server", 10),  # over any provider and the jobs; no provider of its own
    ("testing", 11),
    ("distributed", 11),
    ("integrations", 11),
    ("cli", 12),
    ("", 13),  # the package's __init__
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


def imports_of(path: Path, module: str, modules: set[str]) -> set[str]:
    """The batchclient modules ``module`` imports at run time (names relative to the package)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
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
def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    names = set(modules)
    return {name: imports_of(path, name, names) & names for name, path in modules.items()}


def test_every_module_has_a_layer_and_imports_only_its_layer_or_below() -> None:
    wrong = [
        f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
        for a, targets in graph().items()
        for b in targets
        if layer(b) > layer(a)
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_there_is_no_import_cycle() -> None:
    edges = graph()
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
