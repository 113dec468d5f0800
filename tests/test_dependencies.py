"""Every third-party package that ``src/batchclient`` imports is declared in ``pyproject.toml``
(as a dependency or in an extra), so an install never works only because another package
happened to bring it along."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import batchclient

ROOT = Path(batchclient.__file__).parent
PYPROJECT = ROOT.parents[1] / "pyproject.toml"

NOT_DEPENDENCIES = {
    # used when installed (the benchmark's litellm mode), never required
    "litellm",
}


def _imported_top_level_modules() -> set[str]:
    found: set[str] = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "batchclient"}


def _declared_distributions() -> set[str]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs.extend(extra)
    return {_normalise(re.split(r"[\s\[<>=!~;]", spec, maxsplit=1)[0]) for spec in specs}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_imported_package_is_declared() -> None:
    distributions = importlib.metadata.packages_distributions()
    declared = _declared_distributions()
    missing = []
    for module in sorted(_imported_top_level_modules() - NOT_DEPENDENCIES):
        candidates = {_normalise(d) for d in distributions.get(module, [module])}
        if not candidates & declared:
            missing.append(f"{module} (distribution {', '.join(sorted(candidates))})")
    assert not missing, f"imported by src/batchclient but not in pyproject.toml: {missing}"
