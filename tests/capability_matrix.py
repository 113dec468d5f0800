"""The capability matrix report (imported by ``conftest.py`` for its hooks): every test of
``test_capabilities.py`` records its cell (provider, call kind, face) and what it proved there
(``✓``, or the refusal's code; ``xfail (want ...)`` for a known defect) as a ``user_property``;
the terminal summary prints the cells that ran as a Markdown table (a row per kind and face, a
column per provider), and writes it to ``$BATCHCLIENT_MATRIX_OUT`` when that is set.

User properties travel with the test reports, so the table is complete under pytest-xdist too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import pytest

CELL = "capability_cell"
"""The user property's name; its value is ``(provider, kind, face, shown)``."""

_cells: dict[tuple[str, str, str], str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    xfailed = report.skipped and hasattr(report, "wasxfail")
    if not (report.passed or xfailed):
        return  # a failed cell shows as missing: the failure says why
    for name, value in report.user_properties:
        if name == CELL:
            provider, kind, face, shown = cast(tuple[str, str, str, str], value)
            _cells[(provider, kind, face)] = f"xfail (want {shown})" if xfailed else shown


def render(cells: dict[tuple[str, str, str], str]) -> str:
    """The matrix as Markdown: a row per (kind, face), a column per provider that ran."""
    from test_capabilities import FACES, KINDS, PROVIDERS

    providers = [p for p in PROVIDERS if any(c[0] == p for c in cells)]
    rows = ["| kind | face | " + " | ".join(providers) + " |"]
    rows.append("|---" * (len(providers) + 2) + "|")
    for kind in KINDS:
        for face in FACES:
            shown = [cells.get((p, kind, face), "") for p in providers]
            if any(shown):
                rows.append(f"| {kind} | {face} | " + " | ".join(shown) + " |")
    return "\n".join(rows) + "\n"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _cells:
        return
    table = render(_cells)
    terminalreporter.section("capability matrix")
    terminalreporter.write(table)
    out = os.environ.get("BATCHCLIENT_MATRIX_OUT")
    if out:
        Path(out).write_text(table)
        terminalreporter.write_line(f"(written to {out})")
