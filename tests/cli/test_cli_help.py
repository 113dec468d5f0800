"""The command line as a new user first meets it: ``batchclient --version``, and ``--help`` of
every command and subcommand (``batchclient`` and ``python -m batchclient.testing``) in plain
text, without reST markup."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchclient import __version__
from batchclient.cli import build_parser, main, plain
from batchclient.testing import _process

SRC = str(Path(__file__).resolve().parents[2] / "src")
MARKUP = re.compile(r"`|:[a-z]+:`|\*\*")
"""Literals (any backtick), roles (``:class:`...```) and bold."""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m batchclient.cli ARGS`` in a child process (what the console script runs)."""
    env = {**os.environ, "PYTHONPATH": SRC, "COLUMNS": "100"}
    return subprocess.run(
        [sys.executable, "-m", "batchclient.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """Every command path of ``parser``: ``()``, ``("run",)``, ``("jobs", "list")``, ..."""
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def help_text(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> str:
    """What ``--help`` prints for ``path`` (argparse's own output, as the command prints it)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        parser.parse_args([*path, "--help"])
    assert exited.value.code == 0
    return out.getvalue()


@pytest.mark.slow
def test_version_prints_the_package_version() -> None:
    done = cli("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"batchclient {__version__}\n", "")
    assert "--version" in cli("--help").stdout


@pytest.mark.slow
def test_the_top_level_help_is_plain_text() -> None:
    done = cli("--help")
    assert done.returncode == 0
    assert "run an OpenAI batch file" in done.stdout
    assert not MARKUP.search(done.stdout), done.stdout


@pytest.mark.parametrize("which", ["batchclient", "python -m batchclient.testing"])
def test_every_subcommands_help_is_plain_text(which: str) -> None:
    parser = build_parser() if which == "batchclient" else _process._parser()
    paths = list(commands(parser))
    assert len(paths) >= (13 if which == "batchclient" else 3)  # jobs and cache nest theirs
    marked = {}
    for path in paths:
        text = help_text(parser, path)
        assert "usage:" in text
        found = MARKUP.findall(text)
        if found:
            marked[" ".join(path)] = [line for line in text.splitlines() if MARKUP.search(line)]
    assert not marked, marked


def test_main_prints_the_same_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["jobs", "status", "--help"])
    assert "usage: batchclient jobs status" in capsys.readouterr().out


def test_plain_removes_roles_literals_and_bold() -> None:
    text = ":class:`~batchclient.BatchClient`, :data:`COMMANDS`, ``--cache``, `make demo`, **one**"
    assert plain(text) == "BatchClient, COMMANDS, --cache, make demo, one"
    assert plain("no markup: a:b, 2 * 3") == "no markup: a:b, 2 * 3"
