"""The batch APIs' options are declared once: ``RemoteBatchOptions`` for what every batch API
takes, extended per backend, each entry ``Annotated[type, Option(default, help)]``. The
clients and the provider's constructors spell none of them out, every client's docstring lists
each with its default, one option has one default on every backend, and the CLI's flags and
the registry reach them by their declared names."""

from __future__ import annotations

import argparse
import inspect
from typing import Any

import pytest

from batchclient import (
    AnthropicBatchInference,
    BatchAPIBatchInference,
    ConfigurationError,
    GeminiBatchInference,
    make_client,
    make_provider,
)
from batchclient._options import specs
from batchclient.batchapi import (
    AnthropicBatchOptions,
    BatchAPIOptions,
    GeminiBatchOptions,
    RemoteBatchOptions,
    RemoteBatchProvider,
)
from batchclient.cli._run import add_run_arguments

CASES: list[tuple[type, Any, type]] = [
    (BatchAPIOptions, RemoteBatchProvider.batch_api, BatchAPIBatchInference),
    (AnthropicBatchOptions, RemoteBatchProvider.anthropic, AnthropicBatchInference),
    (GeminiBatchOptions, RemoteBatchProvider.gemini, GeminiBatchInference),
]
IDS = ["batch-api", "anthropic-batch", "gemini-batch"]


@pytest.mark.parametrize(("options", "provider", "client"), CASES, ids=IDS)
def test_constructors_take_the_options_as_unpack_and_spell_none_out(
    options: type, provider: Any, client: type
) -> None:
    for built in (provider, client):
        params = inspect.signature(built).parameters
        named = [n for n, p in params.items() if p.kind is not p.VAR_KEYWORD]
        assert not set(named) & set(specs(options)), built
        (var,) = [p for p in params.values() if p.kind is p.VAR_KEYWORD]
        assert str(var.annotation) == f"Unpack[{options.__name__}]"
        assert params["api_key"].kind is inspect.Parameter.KEYWORD_ONLY  # after the URL
        assert next(iter(params)) == "base_url"


@pytest.mark.parametrize(("options", "provider", "client"), CASES, ids=IDS)
def test_every_client_documents_every_option_with_its_default(
    options: type, provider: Any, client: type
) -> None:
    doc = " ".join((client.__doc__ or "").split())
    for name, spec in specs(options).items():
        assert f"{name} (default " in doc, name
        assert " ".join(spec.help.split()[:6]) in doc  # the help as declared
        if spec.help.startswith("Seconds"):  # the naming rule: seconds end in _s
            assert name.endswith("_s"), name


def test_a_shared_option_has_one_default_on_every_batch_api() -> None:
    shared = specs(RemoteBatchOptions)
    for options, _, _ in CASES:
        own = specs(options)
        assert {n: own[n].default for n in shared} == {n: s.default for n, s in shared.items()}
    assert shared["poll_interval_s"].default == 10.0
    assert shared["max_attempts"].default == 3 and shared["max_retries"].default == 8


def test_the_provider_resolves_defaults_and_refuses_what_it_does_not_take() -> None:
    url = "http://127.0.0.1:9/v1"
    provider = make_provider("batch-api", base_url=url)
    assert isinstance(provider, RemoteBatchProvider)
    assert (provider.options["poll_interval_s"], provider.options["max_attempts"]) == (10.0, 3)
    assert provider.completion_window == "24h"
    gemini = make_provider("gemini-batch", api_key="k")
    assert isinstance(gemini, RemoteBatchProvider) and gemini.completion_window == "48h"
    with pytest.raises(ConfigurationError, match=r"takes no option flavor; .*inline_bytes"):
        make_provider("gemini-batch", api_key="k", flavor="groq")
    with pytest.raises(ConfigurationError, match="max_attempts must be >= 1"):
        make_client("anthropic-batch", api_key="k", max_attempts=0)
    with pytest.raises(ConfigurationError, match="only 24h"):
        AnthropicBatchInference(api_key="k", completion_window="48h")
    with pytest.raises(ConfigurationError, match="poll_interval_s must be float"):
        BatchAPIBatchInference(url, poll_interval_s="fast")  # type: ignore[arg-type]


def test_the_cli_passes_only_the_flags_given() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", default=None)
    add_run_arguments(parser)
    help_text = " ".join(parser.format_help().split())
    assert "remote batch (default 10.0)" in help_text
    from batchclient.cli._providers import provider_options

    base = ["in.jsonl", "-o", "out.jsonl", "--provider", "anthropic-batch", "--api-key", "k"]
    given = provider_options(parser.parse_args(base))
    assert "poll_interval_s" not in given and "max_retries" not in given
    given = provider_options(parser.parse_args([*base, "--poll-interval", "2", "--max-lines", "7"]))
    assert (given["poll_interval_s"], given["max_lines"]) == (2.0, 7)
    provider = make_client("anthropic-batch", **given).provider
    assert isinstance(provider, RemoteBatchProvider) and provider.options["poll_interval_s"] == 2
