"""Every example in README.md and docs/*.md works as pasted.

- ``jsonl`` blocks: every line is one JSON value, and every request line passes the jobs' own
  validation (a request split over two lines fails as a batch file: ``invalid_json_line``);
  ``json`` blocks are one JSON document.
- Shell blocks (``sh``, ``bash``, ``console``: the lines after ``$ ``): ``bash -n`` parses them;
  every ``batchclient`` and ``python -m batchclient.testing`` command parses with the real
  argparse parser (real subcommands, flags and values); ``make`` names a real target. The cheap
  ones run for real against a stub (``batchclient run`` on the remote provider, ``jobs``,
  ``cache``), in a temporary folder holding the docs' own input file.
- ``python`` blocks compile; the README's first example runs against the stub its own command
  starts (and, marked ``server``, against the real vLLM server its own command starts).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletion

from batchclient import ErrorCode
from batchclient.cli import build_parser
from batchclient.jobs import validate_batch_file
from batchclient.jobs._validate import check_request, parse_line
from batchclient.testing import StubProcess, StubServer, free_port
from batchclient.testing import _process as testing_cli

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("sh", "bash", "console")
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} ({self.lang})"


@dataclass(frozen=True)
class Command:
    block: Block
    text: str  # continuation lines joined, as the shell reads them

    def __str__(self) -> str:
        return f"{self.block}: {self.text}"


def blocks(*langs: str) -> list[Block]:
    found = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            opening = FENCE.match(lines[i])
            if opening is None:
                i += 1
                continue
            start, body = i, []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            i += 1
            if opening[1] in langs:
                found.append(Block(path, start + 1, opening[1], "\n".join(body) + "\n"))
    return found


def commands(block: Block) -> Iterator[Command]:
    """The commands of a shell block: in a ``console`` block the lines after ``$ `` (other lines
    are output), elsewhere every line; a line ending in a backslash continues on the next."""
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if block.lang == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [line]
        while parts[-1].endswith("\\") and i < len(lines):
            parts.append(lines[i])
            i += 1
        yield Command(block, "\n".join(parts))


def substituted(text: str) -> str:
    """``text`` with every ``$(...)`` (parentheses balanced) as the word ``SUBSTITUTED``."""
    while (start := text.find("$(")) >= 0:
        depth, end = 0, start + 1
        for end in range(start + 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        text = text[:start] + "SUBSTITUTED" + text[end + 1 :]
    return text


def words(command: Command) -> list[str]:
    """The command's words, without leading ``NAME=value`` assignments (a ``$(...)`` is one
    word here)."""
    argv = shlex.split(substituted(command.text.replace("\\\n", " ")), comments=True)
    while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
        argv.pop(0)
    return argv


ALL_COMMANDS = [c for b in blocks(*SHELL) for c in commands(b)]


def parse_error(parser: Any, argv: list[str]) -> str | None:
    """What argparse says about ``argv`` (None: it parses)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exited:
        return None if exited.code == 0 else err.getvalue().strip().splitlines()[-1]
    return None


def test_the_docs_have_examples_of_every_kind() -> None:
    assert len(ALL_COMMANDS) >= 40
    assert blocks("jsonl") and len(blocks("python")) >= 30


def test_jsonl_lines_parse_and_request_lines_pass_validation() -> None:
    """Line by line, then each block of request lines as a whole batch file (one endpoint, one
    model, unique ids)."""
    problems = []
    requests = 0
    for block in blocks("jsonl"):
        first = json.loads(block.text.splitlines()[0])
        if isinstance(first, dict) and "url" in first:
            report = validate_batch_file(io.BytesIO(block.text.encode()), endpoint=first["url"])
            problems += [f"{block}: {e.code}: {e.message}" for e in report.errors]
        for number, raw in enumerate(block.text.splitlines(), start=block.line + 1):
            if not raw.strip():
                continue
            obj, problem = parse_line(raw.encode())
            if obj is None:
                problems.append(f"{block} line {number}: {problem}")
                continue
            if "body" in obj and "url" in obj:  # a request line of an input file
                requests += 1
                bad = check_request(obj, str(obj["url"]))
                if bad is not None:
                    problems.append(f"{block} line {number}: {bad[0].value}: {bad[1]}")
    assert not problems, problems
    assert requests >= 3


def test_json_blocks_are_json_documents() -> None:
    """One document each; never an input file's request line (those are ``jsonl``: one line
    each, as the file holds them); an output line's chat completion is what the openai SDK
    parses."""
    problems = []
    for block in blocks("json"):
        try:
            doc = json.loads(block.text)
        except ValueError as exc:
            problems.append(f"{block}: {exc}")
            continue
        if isinstance(doc, dict) and {"custom_id", "body"} <= set(doc):
            problems.append(f"{block}: a request line: show it as one line of a jsonl block")
        body = doc.get("response", {}).get("body", {}) if isinstance(doc, dict) else {}
        if body.get("object") == "chat.completion":
            ChatCompletion.model_validate(body)
    assert not problems, problems


def test_shell_blocks_parse_with_bash() -> None:
    problems = []
    for block in blocks(*SHELL):
        script = "\n".join(c.text for c in commands(block))
        done = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        if done.returncode:
            problems.append(f"{block}: {done.stderr.strip()}")
    assert not problems, problems


def test_commands_name_real_subcommands_flags_and_targets() -> None:
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    problems = []
    checked = 0
    for command in ALL_COMMANDS:
        argv = words(command)
        if not argv:  # a variable set for the next commands
            continue
        error = None
        if argv[:1] == ["batchclient"]:
            error = parse_error(build_parser(), argv[1:])
        elif argv[:3] == ["python", "-m", "batchclient.testing"]:
            error = parse_error(testing_cli._parser(), argv[3:])
        elif argv[:1] == ["make"]:
            error = None if set(argv[1:]) <= targets else "no such target in the Makefile"
        else:
            continue
        checked += 1
        if error is not None:
            problems.append(f"{command}\n    -> {error}")
    assert not problems, "\n".join(problems)
    assert checked >= 35


# ---------------------------------------------------------------------- run for real

RUNS = ("run", "jobs", "cache")
"""Subcommands run for real: they finish by themselves against a stub in a second or two."""
LOOPBACK = re.compile(r"http://127\.0\.0\.1:\d+/v1")
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z_]*|.*[<>~].*|\.\.\.)$")
"""A word the reader replaces: ``URL``, ``ID``, ``DIR``, ``<key>``, a ``~/`` path, ``...``."""
JOB_ID = re.compile(r"batch_[0-9a-f]{24}")


def runnable(argv: list[str], folder: Path) -> bool:
    """Whether a ``batchclient`` command can run for real here: one of :data:`RUNS`, on the
    remote provider against loopback, over files that exist here (or that it writes), with no
    placeholder but the base URL and a batch id. ``jobs cancel`` and ``jobs resume`` change a
    batch's state and are only parsed."""
    if argv[:1] != ["batchclient"] or len(argv) < 2 or argv[1] not in RUNS:
        return False
    if argv[1] == "jobs" and argv[2:3] in (["cancel"], ["resume"]):
        return False
    if "--provider" in argv and argv[argv.index("--provider") + 1] != "remote":
        return False
    if any(w.startswith("http") and not LOOPBACK.fullmatch(w) for w in argv):
        return False
    if argv[1] == "run" and not (folder / argv[2]).exists():
        return False
    return not any(PLACEHOLDER.match(w) for w in argv[2:] if w != "URL")


@pytest.mark.slow
def test_cheap_commands_run_for_real_against_a_stub(tmp_path: Path) -> None:
    """``batchclient run`` / ``jobs`` / ``cache`` as the docs show them, in a folder holding
    the docs' own ``requests.jsonl`` (the input file example of docs/jobs.md), the base URL
    pointing at a stub; each exits 0."""
    example = next(b for b in blocks("jsonl") if b.path.name == "jobs.md")
    (tmp_path / "requests.jsonl").write_text(example.text)
    env = {**os.environ, "PYTHONPATH": SRC, "BATCHCLIENT_STATE_DIR": str(tmp_path / "state")}
    ran: list[str] = []
    job = None
    with StubServer() as stub:
        for command in ALL_COMMANDS:
            argv = [JOB_ID.sub(job or "batch_none", w) for w in words(command)]
            argv = [stub.url if w == "URL" else LOOPBACK.sub(stub.url, w) for w in argv]
            if not runnable(argv, tmp_path) or " ".join(argv) in ran:
                continue  # the same command twice (in two docs) runs once
            done = subprocess.run(
                [sys.executable, "-m", "batchclient.cli", *argv[1:]],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
            started = re.search(r"started job (batch_[0-9a-f]+)", done.stderr + done.stdout)
            job = started[1] if started else job
            ran.append(" ".join(argv))
        assert stub.stats.requests > 0
    assert job is not None
    assert {"batchclient jobs list", "batchclient cache stats"} <= set(ran)
    assert sum(r.startswith("batchclient run requests.jsonl") for r in ran) >= 4, ran
    assert len(ran) >= 10, ran
    output = (tmp_path / "results.jsonl").read_text().splitlines()
    assert json.loads(output[0])["response"]["status_code"] == 200


# ---------------------------------------------------------------------- python


def test_python_blocks_compile() -> None:
    problems = []
    for block in blocks("python"):
        try:
            compile(block.text, str(block), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        except SyntaxError as exc:
            problems.append(f"{block}: {exc}")
    assert not problems, problems


def readme_server_command(kind: str) -> list[str]:
    """The README's own command that starts a server to try the first example on."""
    for command in ALL_COMMANDS:
        argv = words(command)
        if command.block.path.name == "README.md" and argv[:4] == [
            "python",
            "-m",
            "batchclient.testing",
            kind,
        ]:
            return argv
    raise AssertionError(f"README.md shows no `python -m batchclient.testing {kind}` command")


def run_first_example(base_url: str) -> list[str]:
    """The README's first Python block as a script, its ``:8000`` pointed at ``base_url``."""
    first = next(b for b in blocks("python") if b.path.name == "README.md")
    assert "http://127.0.0.1:8000/v1" in first.text
    script = first.text.replace("http://127.0.0.1:8000/v1", base_url)
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def with_port(argv: list[str], port: int) -> list[str]:
    assert argv[argv.index("--port") + 1] == "8000"  # the port the first example uses
    return [str(port) if w == "8000" else w for w in argv]


@pytest.mark.slow
def test_the_readme_first_example_runs_on_the_stub_its_command_starts() -> None:
    argv = with_port(readme_server_command("stub"), free_port())
    with StubProcess(*argv[4:]) as stub:
        lines = run_first_example(stub.url)
    assert lines == ["echo: What is the capital of France?", "echo: Name a prime number."]


@pytest.mark.heavy
@pytest.mark.server
def test_the_readme_first_example_runs_on_the_vllm_server_its_command_starts() -> None:
    argv = with_port(readme_server_command("vllm"), free_port())
    proc = subprocess.Popen(
        [sys.executable, *argv[1:]],
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()  # the server starts in about a minute
        assert ready.startswith("READY http://127.0.0.1:"), ready
        lines = run_first_example(ready.split()[1])
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == 0  # SIGTERM stops the server and everything it started
    assert len(lines) == 2 and all(lines), lines
    assert not {e.value for e in ErrorCode} & set(lines), lines  # answers, not error codes
