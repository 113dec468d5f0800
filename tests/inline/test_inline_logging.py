"""What a real engine start prints: by default no vLLM INFO line reaches stdout or stderr,
with ``verbose=True`` they do (from this process and from the engine process vLLM spawns).
Each case runs a tiny script in a fresh interpreter, so vLLM's logging is configured from
scratch as in a user's program."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

SCRIPT = """
import sys
import anyio
from batchclient import SamplingParams, VLLMBatchInference

async def main() -> None:
    async with VLLMBatchInference(
        kv_cache_memory_bytes=256 << 20, verbose=sys.argv[1] == "verbose"
    ) as client:
        result = await client.batch_chat_completion(
            "smollm2", [[{"role": "user", "content": "hi"}]],
            sampling_params=SamplingParams(max_tokens=4),
        )
    print("RESULT", result.batch[0].error or "ok")

if __name__ == "__main__":
    anyio.run(main)
"""

# vLLM's line format: "(EngineCore pid=123) INFO 12-01 14:51:10 [core.py:133] ..."
INFO = re.compile(r"\) INFO \d\d-\d\d \d\d:\d\d:\d\d ")


def run(tmp_path: Path, mode: str) -> list[str]:
    script = tmp_path / "tiny.py"
    script.write_text(SCRIPT)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VLLM_LOGGING_LEVEL", "BATCHCLIENT_VERBOSE")
    }
    env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run(
        [sys.executable, str(script), mode], env=env, capture_output=True, text=True, timeout=600
    )
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 0, "\n".join(lines[-40:])
    assert "RESULT ok" in done.stdout
    return lines


@pytest.mark.heavy
def test_an_engine_start_shows_no_vllm_info_lines_by_default(tmp_path: Path) -> None:
    lines = run(tmp_path, "quiet")
    assert [line for line in lines if INFO.search(line)] == []
    assert not any("Loading safetensors checkpoint shards" in line for line in lines)
    assert len(lines) < 40  # about 66 before; what is left are warnings


@pytest.mark.heavy
def test_verbose_shows_everything_from_every_engine_process(tmp_path: Path) -> None:
    lines = run(tmp_path, "verbose")
    info = [line for line in lines if INFO.search(line)]
    assert any(line.startswith("(EngineCore") for line in info)  # the spawned engine core
    assert any(line.startswith("(MainProcess") for line in info)  # and this process
    assert len(info) > 30
