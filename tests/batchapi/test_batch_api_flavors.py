"""``BatchAPIBatchInference`` over the OpenAI-shaped variants (``flavor=``): Together, Groq and
Mistral, each against ``BatchAPIStub(flavor=...)`` speaking that provider's documented shape on
loopback: results, per-item errors, expiry, status and timestamp mapping (unknown statuses
included), paging of the batch list, lost creates, cancel, windows, and detection from the URL."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import pytest

from batchclient import BatchAPIBatchInference, ConfigurationError
from batchclient.batchapi import RemoteBatchProvider
from batchclient.batchapi._flavors import FLAVORS, detect_flavor, normalize, status_of
from batchclient.batchapi._openai import OpenAIBackend
from batchclient.cli import main
from batchclient.remote import RetryPolicy
from batchclient.testing import BatchAPIStub
from jobs_util import jsonl, line, read_jsonl, until

FAST = RetryPolicy(backoff_initial_s=0.01, backoff_max_s=0.05)
FLAVOR_NAMES = ["openai", "together", "groq", "mistral"]


def client(stub: BatchAPIStub, state: Path, **kwargs: Any) -> BatchAPIBatchInference:
    kwargs.setdefault("flavor", stub.flavor)
    return BatchAPIBatchInference(
        stub.url, poll_interval_s=0.02, retry=FAST, state_dir=state, **kwargs
    )


def provider(stub: BatchAPIStub) -> RemoteBatchProvider:
    options: dict[str, Any] = {"flavor": stub.flavor, "retry": FAST}
    return RemoteBatchProvider.batch_api(stub.url, **options)


def backend(provider: RemoteBatchProvider) -> OpenAIBackend:
    assert isinstance(provider.backend, OpenAIBackend)
    return provider.backend


def convo(texts: list[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": t}] for t in texts]


@pytest.mark.parametrize("flavor", FLAVOR_NAMES)
async def test_each_flavour_runs_a_call_with_per_item_errors(tmp_path: Path, flavor: str) -> None:
    with BatchAPIStub(flavor=flavor, error_match="BAD") as stub:
        async with client(stub, tmp_path) as c:
            prompts = ["a", "b BAD", "c"]
            result = await c.batch_chat_completion("smollm2", convo(prompts))
    got = [i.completion_message.content if i.completion_message else None for i in result.batch]
    assert got == ["echo: a", None, "echo: c"]
    assert result.batch[1].error is not None and result.batch[1].error.status_code == 400
    assert stub.stats.creates == 1 and stub.stats.uploads == 1
    body = stub.created[0]
    if flavor == "mistral":  # its own job body: the model from the file, the window in hours
        assert body["input_files"] and body["model"] == "smollm2"
        assert body["timeout_hours"] == 24
    else:
        assert body["completion_window"] == "24h"
        assert ("metadata" in body) is (flavor != "together")


@pytest.mark.parametrize("flavor", ["together", "mistral"])
async def test_expired_batch_keeps_what_finished(tmp_path: Path, flavor: str) -> None:
    with BatchAPIStub(flavor=flavor, expire_after=2) as stub:
        async with client(stub, tmp_path, max_attempts=2) as c:
            result = await c.batch_chat_completion("smollm2", convo(list("abcdef")))
    codes = [i.error.code if i.error else "ok" for i in result.batch]
    assert codes == ["ok"] * 4 + ["batch_expired"] * 2  # two per batch, two batches
    assert [len(b.lines) for b in stub.batches.values()] == [6, 4]


@pytest.mark.parametrize("flavor", FLAVOR_NAMES)
async def test_an_unknown_status_keeps_polling_and_is_logged(
    tmp_path: Path, flavor: str, caplog: pytest.LogCaptureFixture
) -> None:
    odd = f"PAUSED_{flavor.upper()}"  # a word no reference lists, once per flavour
    with BatchAPIStub(flavor=flavor, line_delay_s=0.02, odd_status=odd, odd_polls=3) as stub:
        with caplog.at_level(logging.WARNING, logger="batchclient.batchapi"):
            async with client(stub, tmp_path) as c:
                result = await c.batch_chat_completion("smollm2", convo(["a", "b", "c"]))
    assert all(i.error is None for i in result.batch)
    assert stub.stats.polls >= 4  # the odd ones, then at least one that saw it end
    assert any(odd in r.getMessage() and "in_progress" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("flavor", FLAVOR_NAMES)
async def test_a_lost_create_is_found_in_the_list_not_sent_again(
    tmp_path: Path, flavor: str
) -> None:
    with BatchAPIStub(flavor=flavor, lose_creates=1) as stub:
        async with client(stub, tmp_path) as c:
            result = await c.batch_chat_completion("smollm2", convo(["a", "b"]))
    assert all(i.error is None for i in result.batch)
    assert stub.stats.creates == 1 and stub.stats.lists >= 1


@pytest.mark.parametrize("flavor", ["openai", "groq", "mistral"])
async def test_find_pages_through_the_batch_list(tmp_path: Path, flavor: str) -> None:
    """The oldest of five batches, two to a page: three pages, by cursor (OpenAI, Groq) or by
    page number (Mistral)."""
    line = b'{"custom_id": "0", "method": "POST", "url": "/v1/chat/completions", '
    line += b'"body": {"model": "smollm2", "messages": [{"role": "user", "content": "x"}]}}\n'
    path = tmp_path / "in.jsonl"
    path.write_bytes(line)
    with BatchAPIStub(flavor=flavor, page_cap=2) as stub:
        async with provider(stub) as p:
            api = backend(p)
            api.page_size = 2
            files = [await api.upload(path, 1, {}) for _ in range(5)]
            created = [
                await api.submit(file_id, path, "/v1/chat/completions", "24h", {"n": str(n)})
                for n, file_id in enumerate(files)
            ]
            found = await api.find(files[0], {"n": "0"}, 1, 0.0)
            assert stub.stats.lists == 3
            assert found is not None and found == created[0]
            assert await api.find("file-none", {"n": "0"}, 1, 0.0) is None


async def test_together_list_is_one_unpaged_array(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"custom_id": "0", "body": {"model": "m", "messages": []}}\n')
    with BatchAPIStub(flavor="together", page_cap=1, line_delay_s=60) as stub:  # still running
        async with provider(stub) as p:
            api = backend(p)
            files = [await api.upload(path, 1, {}) for _ in range(3)]
            created = [
                await api.submit(file_id, path, "/v1/chat/completions", "24h", {})
                for file_id in files
            ]
            for batch_id in created:  # VALIDATING, inside {"job": ...}
                assert batch_id in stub.batches
                assert (await api.poll(batch_id)).status == "in_progress"
            found = await api.find(files[0], {"batchclient_job": "ignored: no metadata"}, 1, 0.0)
            assert found is not None and found == created[0]
            assert stub.stats.lists == 1


@pytest.mark.parametrize("flavor", ["together", "mistral"])
async def test_cancel_maps_the_flavours_states(tmp_path: Path, flavor: str) -> None:
    with BatchAPIStub(flavor=flavor, line_delay_s=0.2) as stub:  # seconds left to cancel
        async with client(stub, tmp_path) as c:
            record = await c.files.create(
                jsonl([line(f"r{i}", f"n{i}") for i in range(40)]), filename="in.jsonl"
            )
            job = await c.schedule_batch(record.id)

            async def running() -> bool:
                return any(
                    b.data["request_counts"]["completed"] >= 3 for b in stub.batches.values()
                )

            await until(running, within=10)
            await c.job_cancel(job.job_id)
            info = await c.batches.retrieve(job.job_id)
            result = await c.job_result(job.job_id)
    assert info.status == "cancelled" and stub.stats.cancels == 1
    done = [i for i in result.batch if i.error is None]
    cancelled = [i for i in result.batch if i.error and i.error.code == "batch_cancelled"]
    assert len(done) >= 3 and len(done) + len(cancelled) == 40


def test_statuses_and_timestamps_normalise_per_flavour() -> None:
    together = normalize(
        FLAVORS["together"],
        {"job": {"id": "b", "status": "IN_PROGRESS", "created_at": "2026-01-02T03:04:05Z",
                 "job_deadline": "2026-01-03T03:04:05Z", "input_file_id": "f",
                 "error": None}, "warning": None},
    )  # fmt: skip
    assert together["status"] == "in_progress" and together["created_at"] == 1767323045
    assert together["expires_at"] == together["created_at"] + 86400
    mistral = normalize(
        FLAVORS["mistral"],
        {"id": "j", "status": "TIMEOUT_EXCEEDED", "input_files": ["f"], "output_file": "o",
         "error_file": None, "total_requests": 4, "succeeded_requests": 2,
         "failed_requests": 1, "errors": [{"message": "boom", "count": 1}]},
    )  # fmt: skip
    assert mistral["status"] == "expired" and mistral["input_file_id"] == "f"
    assert mistral["output_file_id"] == "o"
    assert mistral["request_counts"] == {"total": 4, "completed": 2, "failed": 1}
    assert mistral["errors"]["data"][0]["message"] == "boom"
    for name, word, want in [
        ("mistral", "QUEUED", "validating"), ("mistral", "SUCCESS", "completed"),
        ("mistral", "CANCELLATION_REQUESTED", "cancelling"), ("together", "CANCELLED", "cancelled"),
        ("groq", "finalizing", "finalizing"), ("openai", "SOMETHING_NEW", "in_progress"),
        ("together", None, "in_progress"),
    ]:  # fmt: skip
        assert status_of(FLAVORS[name], word) == want


def test_flavour_is_detected_from_the_host() -> None:
    assert detect_flavor("https://api.together.xyz/v1") == "together"
    assert detect_flavor("https://api.groq.com/openai/v1") == "groq"
    assert detect_flavor("https://api.mistral.ai/v1") == "mistral"
    assert detect_flavor("https://api.openai.com/v1") == "openai"
    assert detect_flavor("http://127.0.0.1:8000/v1") == "openai"
    c = BatchAPIBatchInference("https://api.groq.com/openai/v1", completion_window="7d")
    assert c.provider.flavor == "groq" and c.provider.identity()["flavor"] == "groq"
    assert c.provider.completion_window == "7d"
    t = BatchAPIBatchInference("https://api.together.xyz/v1")
    assert isinstance(t.provider.backend, OpenAIBackend)
    assert t.provider.backend.spec.purpose == "batch-api"


@pytest.mark.parametrize(
    ("url", "flavor", "window"),
    [
        ("https://api.openai.com/v1", None, "48h"),
        ("https://api.together.xyz/v1", None, "2d"),
        ("https://api.groq.com/openai/v1", None, "8d"),
        ("https://api.groq.com/openai/v1", None, "12h"),
        ("https://api.mistral.ai/v1", None, "90m"),
        ("https://api.mistral.ai/v1", None, "8d"),
        ("http://127.0.0.1:1/v1", "nosuch", "24h"),
    ],
)
def test_windows_a_flavour_refuses_are_configuration_errors(
    url: str, flavor: Any, window: str
) -> None:
    with pytest.raises(ConfigurationError):
        BatchAPIBatchInference(url, flavor=flavor, completion_window=window)


async def test_groq_window_beyond_a_day_reaches_the_create(tmp_path: Path) -> None:
    with BatchAPIStub(flavor="groq") as stub:
        async with client(stub, tmp_path, completion_window="7d") as c:
            result = await c.batch_chat_completion("smollm2", convo(["a"]))
    assert result.batch[0].error is None
    assert stub.created[0]["completion_window"] == "7d"


async def test_mistral_model_is_read_from_the_part_after_a_crash_between_upload_and_create(
    tmp_path: Path,
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"custom_id": "0", "body": {"model": "smollm2", "messages": []}}\n')
    with BatchAPIStub(flavor="mistral") as stub:
        async with provider(stub) as p:
            file_id = await backend(p).upload(path, 1, {})
        async with provider(stub) as fresh:
            batch_id = await backend(fresh).submit(file_id, path, "/v1/chat/completions", "24h", {})
    assert stub.batches[batch_id].data["input_file_id"] == file_id
    assert stub.created[0]["model"] == "smollm2" and stub.stats.downloads == 0


@pytest.mark.parametrize("flavor", ["together", "mistral"])
def test_cli_runs_a_file_with_a_flavour(tmp_path: Path, flavor: str) -> None:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(jsonl([line(f"r{i}", f"n{i}") for i in range(3)]))
    with BatchAPIStub(flavor=flavor) as stub:
        args = ["run", str(inp), "-o", str(out), "--provider", "batch-api", "--flavor", flavor]
        args += ["--base-url", stub.url, "--poll-interval", "0.02", "--no-progress"]
        assert main([*args, "--state-dir", str(tmp_path / "state")]) == 0
    rows = read_jsonl(out)
    assert sorted(r["custom_id"] for r in rows) == ["r0", "r1", "r2"]
    assert all(r["response"]["status_code"] == 200 for r in rows)
    assert stub.stats.creates == 1


def test_cli_dry_run_shows_the_batch_price(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([line(f"r{i}", "hello there", max_tokens=100) for i in range(10)]))
    args = ["run", str(inp), "--dry-run", "--provider", "batch-api"]
    args += ["--base-url", "https://api.together.xyz/v1", "--state-dir", str(tmp_path / "s")]
    assert main([*args, "--price-input", "0.5", "--price-output", "1.0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(o.startswith("cost:              $0.0010 at most") for o in out), out
    assert any("as together's batch prices" in o and "50%" in o for o in out), out


def test_cli_never_sends_an_openai_key_to_another_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from batchclient.cli._providers import provider_options
    from batchclient.cli._run import add_run_arguments

    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    monkeypatch.setenv("GROQ_API_KEY", "gsk-groq")
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    groq = parser.parse_args(["in", "--provider", "batch-api", "--base-url", GROQ])
    assert provider_options(groq)["api_key"] == "gsk-groq"
    assert "flavor" not in provider_options(groq)  # detected by the client from the host
    named = parser.parse_args(
        ["in", "--provider", "batch-api", "--base-url", "http://127.0.0.1:1/v1",
         "--flavor", "mistral"]
    )  # fmt: skip
    monkeypatch.delenv("MISTRAL_API_KEY", raising=False)
    assert provider_options(named)["api_key"] is None
    openai = parser.parse_args(["in", "--provider", "batch-api", "--base-url", "http://x/v1"])
    assert provider_options(openai)["api_key"] == "sk-openai"
    remote = parser.parse_args(["in", "--base-url", GROQ])  # the live fan-out too
    assert provider_options(remote)["api_key"] == "gsk-groq"
    given = parser.parse_args(
        ["in", "--base-url", GROQ, "--provider", "batch-api", "--api-key", "k"]
    )
    assert provider_options(given)["api_key"] == "k"


GROQ = "https://api.groq.com/openai/v1"
