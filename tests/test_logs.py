"""How much of vLLM's output reaches the terminal: quiet by default, everything with
``verbose=True`` / ``BATCHCLIENT_VERBOSE=1``, and a ``VLLM_LOGGING_LEVEL`` the user set wins.
The real engine's output is checked in ``test_inline_logging.py``."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from batchclient import VLLMBatchInference
from batchclient._logs import VERBOSE_ENV, copy_output, is_verbose, vllm_env, vllm_logging

LEVEL = "VLLM_LOGGING_LEVEL"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LEVEL, raising=False)
    monkeypatch.delenv(VERBOSE_ENV, raising=False)


@pytest.mark.parametrize(
    ("value", "verbose"),
    [("1", True), ("true", True), (" YES ", True), ("on", True), ("0", False), ("", False)],
)
def test_the_environment_variable_turns_verbose_on(
    monkeypatch: pytest.MonkeyPatch, value: str, verbose: bool
) -> None:
    monkeypatch.setenv(VERBOSE_ENV, value)
    assert is_verbose() is verbose
    assert is_verbose(True) is True


def test_quiet_by_default_inside_the_block_only() -> None:
    with vllm_logging() as quiet:
        assert quiet and os.environ[LEVEL] == "WARNING"
        assert vllm_env() == {}  # already set: children inherit it as it is
    assert LEVEL not in os.environ
    assert vllm_env() == {LEVEL: "WARNING"}


def test_verbose_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    with vllm_logging(verbose=True) as quiet:
        assert not quiet and LEVEL not in os.environ
    monkeypatch.setenv(VERBOSE_ENV, "1")
    with vllm_logging() as quiet:
        assert not quiet and LEVEL not in os.environ
    assert vllm_env() == {}


def test_a_level_the_user_set_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LEVEL, "DEBUG")
    with vllm_logging() as quiet:
        assert not quiet and os.environ[LEVEL] == "DEBUG"
    assert os.environ[LEVEL] == "DEBUG"  # never removed
    assert vllm_env() == {}


def test_overlapping_blocks_keep_it_set_until_the_last_ends() -> None:
    outer = vllm_logging()
    outer.__enter__()
    with vllm_logging() as inner_quiet:
        assert inner_quiet
    assert os.environ[LEVEL] == "WARNING"  # the outer block is still starting its engine
    outer.__exit__(None, None, None)
    assert LEVEL not in os.environ


def test_copy_output_writes_the_log_and_echoes(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_bytes(b"before\n")
    echo = io.BytesIO()
    code = "import sys; print('one'); print('two', file=sys.stderr); print('three')"
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert proc.stdout is not None
    thread = copy_output(proc.stdout, log, echo)
    assert proc.wait(timeout=30) == 0
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert log.read_bytes() == b"before\none\ntwo\nthree\n"  # appended, nothing lost
    assert echo.getvalue() == b"one\ntwo\nthree\n"


def test_verbose_reaches_the_provider() -> None:
    assert VLLMBatchInference().provider.verbose is False
    assert VLLMBatchInference(verbose=True).provider.verbose is True
