"""One provider registry: a name and options -> the provider or its client, for the CLI
(``run``, ``serve``, ``bench``), the lm-eval model and Python callers alike."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any

import pytest

import batchclient
from batchclient import (
    AnthropicBatchInference,
    BatchAPIBatchInference,
    ConfigurationError,
    GeminiBatchInference,
    RayBatchInference,
    RemoteBatchInference,
    VLLMBatchInference,
    make_client,
    make_provider,
)
from batchclient._options import resolve
from batchclient._registry import PROVIDERS
from batchclient.batchapi import RemoteBatchProvider
from batchclient.cli._run import add_run_arguments
from batchclient.cli._run import make_client as client_from_args
from batchclient.cli._serve import add_serve_arguments
from batchclient.distributed import RayProvider
from batchclient.inline import VLLMProvider
from batchclient.integrations.lm_eval._session import client_factory
from batchclient.remote import RemoteOptions, RemoteProvider

URL = "http://127.0.0.1:9/v1"
NAMES = ["remote", "vllm", "ray", "batch-api", "anthropic-batch", "gemini-batch"]
BUILT: dict[str, tuple[dict[str, Any], type, type]] = {
    "remote": ({"base_url": URL, "max_concurrency": 3}, RemoteProvider, RemoteBatchInference),
    "vllm": ({"max_concurrency": 3, "dtype": "float32"}, VLLMProvider, VLLMBatchInference),
    "ray": ({"max_concurrency": 3, "replicas": 2}, RayProvider, RayBatchInference),
    "batch-api": ({"base_url": URL, "poll_interval_s": 3.0}, RemoteBatchProvider,
                  BatchAPIBatchInference),
    "anthropic-batch": ({"api_key": "k", "base_url": URL, "poll_interval_s": 3.0},
                        RemoteBatchProvider, AnthropicBatchInference),
    "gemini-batch": ({"api_key": "k", "base_url": URL, "poll_interval_s": 3.0},
                     RemoteBatchProvider, GeminiBatchInference),
}  # fmt: skip


def choices(add: Any) -> list[str]:
    parser = argparse.ArgumentParser()
    add(parser)
    action = next(a for a in parser._actions if a.dest == "provider")
    return list(action.choices or ())


def test_the_names_are_the_clis() -> None:
    assert list(PROVIDERS) == NAMES
    assert choices(add_run_arguments) == NAMES
    assert choices(add_serve_arguments) == ["remote", "vllm", "ray"]  # a server runs requests


@pytest.mark.parametrize("name", NAMES)
def test_a_name_gives_its_provider_and_its_client(name: str, tmp_path: Path) -> None:
    options, provider_class, client_class = BUILT[name]
    provider = make_provider(name, **options)
    assert type(provider) is provider_class
    client = make_client(name, state_dir=tmp_path, **options)
    assert type(client) is client_class and client.state_dir == tmp_path
    assert type(client.provider) is provider_class
    for built in (provider, client.provider):
        assert built.identity() == provider.identity()
        if "max_concurrency" in options:
            assert built.max_concurrency == 3  # type: ignore[attr-defined]
    if PROVIDERS[name].cache:
        assert make_client(name, cache=True, **options).cache


def test_unknown_names_and_options_are_refused_naming_what_there_is() -> None:
    with pytest.raises(ConfigurationError, match="remote, vllm, ray, batch-api"):
        make_provider("hf")
    with pytest.raises(ConfigurationError, match="remote, vllm, ray, batch-api"):
        make_client("openai")
    with pytest.raises(ConfigurationError, match="needs base_url"):
        make_provider("remote")
    with pytest.raises(ConfigurationError, match=r"no option max_lnes.*max_lines"):
        make_client("batch-api", base_url=URL, max_lnes=10)
    with pytest.raises(ConfigurationError, match="no option max_concurrency"):
        make_provider("batch-api", base_url=URL, max_concurrency=10)
    with pytest.raises(ConfigurationError, match="no option replicas"):
        make_provider("remote", base_url=URL, replicas=2)
    with pytest.raises(ConfigurationError, match="result cache"):
        make_client("batch-api", base_url=URL, cache=True)
    # vllm and ray pass other options to the engine, which checks them when it starts
    inline = make_provider("vllm", max_model_len=512)
    assert isinstance(inline, VLLMProvider) and inline.engine_args == {"max_model_len": 512}


def _cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", default=None)
    add_run_arguments(parser)
    return parser.parse_args(["in.jsonl", "-o", "out.jsonl", *argv])


def test_the_cli_builds_its_clients_through_the_registry(tmp_path: Path) -> None:
    remote = client_from_args(
        _cli("--base-url", URL, "--max-concurrency", "5", "--max-retries", "0", "--cache")
    )
    assert type(remote) is RemoteBatchInference and remote.cache
    assert (remote.provider.max_concurrency, remote.provider.max_retries) == (5, 0)
    batch = client_from_args(
        _cli("--provider", "batch-api", "--base-url", URL, "--poll-interval", "2")
    )
    assert type(batch) is BatchAPIBatchInference and batch.provider.options["poll_interval_s"] == 2
    inline = client_from_args(_cli("--provider", "vllm", "--engine-arg", "dtype=float32"))
    assert type(inline) is VLLMBatchInference
    assert inline.provider.engine_args == {"dtype": "float32"}
    with pytest.raises(ConfigurationError, match="--base-url"):
        client_from_args(_cli("--provider", "remote"))
    with pytest.raises(ConfigurationError, match="own flags"):
        client_from_args(_cli("--provider", "vllm", "--engine-arg", "model=other"))


def test_the_lm_eval_model_builds_its_client_through_the_registry(tmp_path: Path) -> None:
    common: dict[str, Any] = {"api_key": None, "tokenizer": None, "state_dir": tmp_path}
    given = {"max_concurrency": 7, "timeout_s": 30.0, "max_retries": 1, "rpm": 60.0}
    remote = client_factory("remote", "m", base_url=URL + "/completions", options=given, **common)()
    assert type(remote) is RemoteBatchInference and remote.base_url == URL
    assert remote.provider.max_concurrency == 7 and remote.state_dir == tmp_path
    assert (remote.provider.timeout_s, remote.provider.options["rpm"]) == (30.0, 60.0)
    default = client_factory("remote", "m", base_url=URL, options={}, **common)()
    assert isinstance(default, RemoteBatchInference)
    assert default.provider.options == resolve(RemoteOptions, {}, who="x")  # none passed
    engine = {"max_concurrency": 7, "max_model_len": 512}
    ray = client_factory("ray", None, base_url=None, options=engine, **common)()
    assert type(ray) is RayBatchInference and ray.provider.engine_args == {"max_model_len": 512}
    assert ray.provider.max_concurrency == 7
    with pytest.raises(ConfigurationError, match="remote, vllm, ray, batch-api"):
        client_factory("hf", None, base_url=None, options={}, **common)
    with pytest.raises(ConfigurationError, match="no option rmp"):  # checked before building
        client_factory("remote", "m", base_url=URL, options={"rmp": 60.0}, **common)
    with pytest.raises(ConfigurationError, match="tokenizer is not an option of vllm"):
        client_factory("vllm", None, base_url=None, options={}, **{**common, "tokenizer": "d"})


NAME_BASED = [
    "cli/_run.py", "cli/_serve.py", "cli/_providers.py", "integrations/lm_eval/_session.py",
    "cli/_bench",
]  # fmt: skip
"""The modules that build providers from a name: only through the registry."""


def test_no_module_that_builds_from_a_name_calls_a_provider_constructor_itself() -> None:
    constructors = {e.provider.__name__ for e in PROVIDERS.values()}  # type: ignore[attr-defined]
    constructors |= {e.client.__name__ for e in PROVIDERS.values()}  # type: ignore[attr-defined]
    root = Path(batchclient.__file__).parent
    called = []
    for where in NAME_BASED:
        paths = [root / where] if where.endswith(".py") else sorted((root / where).rglob("*.py"))
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and ast.unparse(node.func) in constructors:
                    called.append(f"{path.relative_to(root)}:{node.lineno}")
    assert called == []
