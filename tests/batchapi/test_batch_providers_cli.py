"""The Anthropic and Gemini batch clients as a new user meets them from the shell and from
lm-eval: ``batchclient run --dry-run`` needs no key (nothing is sent) and names the batch
discount; ``batchclient lm-eval --provider anthropic-batch|gemini-batch`` is refused up front
(lm-eval's requests need ``/v1/completions``); ``BatchClientLM``'s client for them is built with
the given base URL and the provider's own key variable (a real call through the SDK at the
stub, which refuses any other key)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from batchclient import ConfigurationError, SamplingParams
from batchclient.cli import main
from batchclient.integrations.lm_eval._session import client_factory
from batchclient.testing import AnthropicBatchStub, GeminiBatchStub
from jobs_util import jsonl, line

KEY = "sk-test"
KEY_VARIABLES = ("ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY")
STUBS: dict[str, Any] = {"anthropic-batch": AnthropicBatchStub, "gemini-batch": GeminiBatchStub}
# each provider's tests join its SDK's module in one test process ("anthropic", "gemini")
PROVIDERS = [
    pytest.param(name, marks=pytest.mark.xdist_group(name.removesuffix("-batch")))
    for name in sorted(STUBS)
]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_dry_run_needs_no_key_sends_nothing_and_names_the_discount(
    provider: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in KEY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    requests = tmp_path / "in.jsonl"
    requests.write_bytes(jsonl([line("a", "hello", max_tokens=8), line("b", "hi", max_tokens=8)]))
    with STUBS[provider](api_key=KEY) as stub:
        argv = ["run", str(requests), "--dry-run", "--provider", provider]
        argv += ["--base-url", stub.url, "--state-dir", str(tmp_path / "state")]
        assert main([*argv, "--price-input", "3", "--price-output", "15"]) == 0
        assert stub.batches == {}
    out = capsys.readouterr().out
    assert "dry run: nothing was sent" in out
    assert f"batch price:       the prices given, as {provider}'s batch prices" in out
    assert "half the" in out


@pytest.mark.parametrize("provider", PROVIDERS)
def test_lm_eval_client_reaches_the_base_url_with_the_provider_key(
    provider: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in KEY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(
        "ANTHROPIC_API_KEY" if provider == "anthropic-batch" else "GEMINI_API_KEY", KEY
    )
    options: dict[str, Any] = {"api_key": None, "state_dir": tmp_path}
    options["options"] = {"timeout_s": 30.0, "max_retries": 0, "poll_interval_s": 0.02}
    with pytest.raises(ConfigurationError, match=f"tokenizer is not an option of {provider}"):
        client_factory(provider, "m", base_url=None, tokenizer="dir", **options)
    with pytest.raises(ConfigurationError, match="needs model"):
        client_factory(provider, None, base_url=None, tokenizer=None, **options)
    with STUBS[provider](api_key=KEY) as stub:
        make = client_factory(provider, "m", base_url=stub.url, tokenizer=None, **options)

        async def go() -> list[Any]:
            async with make() as client:
                params = SamplingParams(max_tokens=4)
                messages = [[{"role": "user", "content": "hello there"}]]
                return (await client.batch_chat_completion("m", messages, params)).batch

        (item,) = anyio.run(go)
    assert item.error is None and "hello" in str(item.text)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_lm_eval_command_refuses_a_chat_only_provider_up_front(
    provider: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["lm-eval", "--provider", provider, "--model", "m", "--state-dir", str(tmp_path)]
    assert main([*argv, "--", "--tasks", "anything"]) == 2
    err = capsys.readouterr().err
    assert "/v1/completions" in err and f"--provider {provider}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_empty_model_name_is_refused_before_anything_is_sent(
    provider: str, tmp_path: Path
) -> None:
    with STUBS[provider](api_key=KEY) as stub:
        make = client_factory(
            provider, "m", base_url=stub.url, api_key=KEY, tokenizer=None, state_dir=tmp_path,
            options={"timeout_s": 30.0, "max_retries": 0},
        )  # fmt: skip

        async def go() -> None:
            async with make() as client:
                messages = [[{"role": "user", "content": "hello"}]]
                with pytest.raises(ConfigurationError, match="non-empty"):
                    await client.batch_chat_completion(" ", messages)

        anyio.run(go)
        assert stub.batches == {}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_dry_run_of_a_file_for_an_endpoint_it_does_not_serve_is_refused_as_a_run_is(
    provider: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = tmp_path / "in.jsonl"
    body = {"model": "m", "prompt": "x", "max_tokens": 3}
    requests.write_text(
        json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body})
        + "\n"
    )
    argv = ["run", str(requests), "--provider", provider, "--api-key", KEY]
    argv += ["--state-dir", str(tmp_path / "state")]
    assert main([*argv, "--dry-run"]) == 2
    assert "'/v1/completions' is not served" in capsys.readouterr().err


@pytest.mark.parametrize("provider", PROVIDERS)
def test_flavor_is_refused_and_max_lines_packs_the_remote_batches(
    provider: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = tmp_path / "in.jsonl"
    requests.write_bytes(jsonl([line(f"r{i}", f"hello {i}", max_tokens=8) for i in range(5)]))
    argv = ["run", str(requests), "--provider", provider, "--api-key", KEY, "--no-progress"]
    assert main([*argv, "--dry-run", "--flavor", "together"]) == 2
    assert f"--flavor does not apply to provider {provider!r}" in capsys.readouterr().err
    with STUBS[provider](api_key=KEY) as stub:
        argv += ["--base-url", stub.url, "--poll-interval", "0.02", "--max-lines", "2"]
        argv += ["--state-dir", str(tmp_path / "state"), "-o", str(tmp_path / "out.jsonl")]
        assert main(argv) == 0
        assert len(stub.batches) == 3  # 5 requests, at most 2 a batch
