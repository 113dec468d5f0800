"""The state directory holds every prompt and answer: it is created 0700, its files 0600."""

from __future__ import annotations

import stat
from pathlib import Path

from batchclient import RemoteBatchInference
from batchclient.testing import StubServer

LINE = (
    b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",'
    b' "body": {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}}\n'
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_state_directory_0700_and_files_0600(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with StubServer() as stub:
        async with RemoteBatchInference(stub.url, state_dir=state) as client:
            batch = await client.batches.create((await client.files.create(LINE)).id)
            batch = await client.batches.wait(batch.id)
            assert batch.output_file_id is not None
            await client.batches.export(batch.id, tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    assert mode(state) == 0o700 and mode(state / "files") == 0o700
    files = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.suffix == ".sqlite3" for p in files) and len(files) >= 3
    assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}
    assert mode(tmp_path / "out.jsonl") == 0o600  # exports of prompts and answers too
