"""inspect_ai's batch mode against ``batchclient serve``, run as docs/server.md shows it: its task
file, its batch config and its ``inspect eval`` command, with real inspect-ai (0.3.285) and one
question the upstream refuses. With batches of one request and ``--no-fail-on-error`` the refusal
costs only its own sample."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from batchclient.testing import Fault, StubReply, StubServer, free_port
from server_util import KEY_A, ready, sdk, spawn

# found, not imported: inspect_ai takes seconds to import, and the test runs it as a command
pytestmark = pytest.mark.skipif(find_spec("inspect_ai") is None, reason="inspect-ai: dev extra")

DOC = Path(__file__).resolve().parents[2] / "docs" / "server.md"
LOG_ARGS = ("--log-dir", "logs", "--log-format", "json", "--display", "none")
REFUSED = {"error": {"message": "no such country", "type": "invalid_request_error"}}


def fenced(lang: str, first_line: str) -> str:
    """The block of ``lang`` in docs/server.md whose first line is ``first_line``."""
    blocks: list[str] = re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(), re.S | re.M)
    (block,) = [b for b in blocks if b.startswith(first_line + "\n")]
    return block


def recipe_command() -> list[str]:
    commands = [
        line.removeprefix("$ ")
        for block in re.findall(r"^```console\n(.*?)^```", DOC.read_text(), re.S | re.M)
        for line in block.splitlines()
        if line.startswith("$ inspect eval") and "--batch batch.yaml" in line
    ]
    (command,) = commands
    return shlex.split(command, comments=True)


@pytest.mark.slow
def test_the_docs_inspect_batch_recipe_loses_only_the_refused_sample(tmp_path: Path) -> None:
    (tmp_path / "task.py").write_text(fenced("python", "# task.py"))
    (tmp_path / "batch.yaml").write_text(fenced("yaml", "# batch.yaml"))
    argv = recipe_command()
    assert argv[:2] == ["inspect", "eval"] and "--no-fail-on-error" in argv
    refuse = Fault(StubReply(status=400, body=REFUSED), match="Atlantis")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with StubServer(faults=[refuse]) as stub:
        proc = spawn(stub.url, tmp_path / "state", port)
        try:
            ready(url, proc)
            env = {**os.environ, "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": KEY_A}
            done = subprocess.run(
                [sys.executable, "-m", "inspect_ai", *argv[1:], *LOG_ARGS],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            batches = sdk(url).batches.list().data
        finally:
            proc.kill()
            proc.wait()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (log_file,) = (tmp_path / "logs").glob("*.json")
    log = json.loads(log_file.read_text())
    assert log["status"] == "success"
    outcome = {}
    for sample in log["samples"]:
        choices = sample["output"].get("choices") or [{}]
        answer = (choices[0].get("message") or {}).get("content")
        outcome[sample["input"]] = "error" if sample.get("error") else answer
    assert outcome == {
        "What is the capital of France?": "echo: What is the capital of France?",
        "What is the capital of Atlantis?": "error",
        "What is the capital of Japan?": "echo: What is the capital of Japan?",
    }
    # one request per batch, through the server's /v1/batches
    assert len(batches) == 3 and all(
        b.request_counts and b.request_counts.total == 1 for b in batches
    )
