"""Each provider's options are declared once, as a ``TypedDict`` (``RemoteOptions``, ...), and
the provider, its client and the options agree: the same names, the same annotations (as
text) and, where a client spells them out, the same defaults."""

from __future__ import annotations

import inspect
from typing import Any, ForwardRef

import pytest

from batchclient import (
    BatchAPIBatchInference,
    ConfigurationError,
    RayBatchInference,
    RayOptions,
    RayProvider,
    RemoteBatchInference,
    RemoteOptions,
    RemoteProvider,
    VLLMBatchInference,
    VLLMOptions,
    VLLMProvider,
    make_provider,
)

CLIENT_OWN = {"state_dir", "cache"}
"""Keyword options every client has of its own (the state directory, the result cache)."""

CASES: list[tuple[type, type, type, set[str]]] = [
    # (options, provider, client, the client's own options besides CLIENT_OWN)
    (RemoteOptions, RemoteProvider, RemoteBatchInference, set()),
    (VLLMOptions, VLLMProvider, VLLMBatchInference, set()),
    (RayOptions, RayProvider, RayBatchInference, set()),
]  # fmt: skip
# the batch providers' options are resolved from their TypedDicts (tests/test_batch_api_options.py)
IDS = [options.__name__ for options, *_ in CASES]


def declared(options: type) -> dict[str, str]:
    """The options' names and annotations as text."""
    out = {}
    for name, annotation in options.__annotations__.items():
        out[name] = annotation.__forward_arg__ if isinstance(annotation, ForwardRef) else annotation
    return out


def parameters(cls: type, kind: Any) -> dict[str, inspect.Parameter]:
    return {
        name: p
        for name, p in inspect.signature(cls.__init__).parameters.items()  # type: ignore[misc]
        if p.kind is kind and name != "self"
    }


KEYWORD, POSITIONAL = inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
VAR = inspect.Parameter.VAR_KEYWORD


@pytest.mark.parametrize(("options", "provider", "client", "own"), CASES, ids=IDS)
def test_the_options_are_the_providers_keyword_arguments(
    options: type, provider: type, client: type, own: set[str]
) -> None:
    keywords = {name: str(p.annotation) for name, p in parameters(provider, KEYWORD).items()}
    assert keywords == declared(options)


@pytest.mark.parametrize(("options", "provider", "client", "own"), CASES, ids=IDS)
def test_the_client_takes_the_providers_arguments_and_its_own(
    options: type, provider: type, client: type, own: set[str]
) -> None:
    def shape(ps: dict[str, inspect.Parameter]) -> list[tuple[str, str, str]]:
        return [(n, str(p.annotation), repr(p.default)) for n, p in ps.items()]

    assert shape(parameters(client, POSITIONAL)) == shape(parameters(provider, POSITIONAL))
    client_keywords = parameters(client, KEYWORD)
    its_own = set(client_keywords) - set(declared(options))
    assert its_own - own <= CLIENT_OWN and own <= its_own
    var = parameters(client, VAR)
    if set(declared(options)) <= set(client_keywords):
        # vLLM's open-ended engine arguments leave no room for ``Unpack``: the client spells
        # the options out, with the provider's defaults, and passes engine arguments on
        provider_keywords = parameters(provider, KEYWORD)
        assert shape({n: client_keywords[n] for n in provider_keywords}) == shape(provider_keywords)
        assert [str(p.annotation) for p in var.values()] == ["Any"]
    else:
        assert not set(declared(options)) & set(client_keywords)
        assert [str(p.annotation) for p in var.values()] == [f"Unpack[{options.__name__}]"]


def test_the_clients_pass_their_options_to_the_provider() -> None:
    remote = RemoteBatchInference(
        "http://127.0.0.1:9/v1", "sk-x", max_concurrency=3, max_retries=0, timeout=5.0
    )
    provider = remote.provider
    assert (provider.max_concurrency, provider.max_retries, provider.timeout) == (3, 0, 5.0)
    assert RemoteBatchInference(base_url="http://127.0.0.1:9/v1").provider.max_concurrency == 64
    batch = BatchAPIBatchInference(
        "http://127.0.0.1:9/v1", poll_interval_s=0.5, completion_window="1h", max_lines=10
    )
    assert (batch.provider.settings.poll_interval_s, batch.provider.completion_window) == (
        0.5,
        "1h",
    )
    vllm = VLLMBatchInference(None, max_concurrency=5, dtype="float32")
    assert vllm.provider.max_concurrency == 5 and vllm.provider.engine_args == {"dtype": "float32"}
    ray = RayBatchInference(replicas=2, max_model_len=512)
    assert ray.provider.replicas == 2 and ray.provider.engine_args == {"max_model_len": 512}
    assert VLLMBatchInference(None).provider.single_token_scoring is True
    vllm_off = VLLMBatchInference(None, single_token_scoring=False).provider
    assert vllm_off.single_token_scoring is False
    off = RayBatchInference(single_token_scoring=False, dtype="float32").provider
    assert off.single_token_scoring is False and off.engine_args == {"dtype": "float32"}
    assert ray.provider.prefix_affinity is True
    assert RayBatchInference(prefix_affinity=False).provider.prefix_affinity is False


@pytest.mark.parametrize(
    "options",
    [
        {"poll_interval_s": 0},
        {"timeout_s": 0},
        {"max_retries": -1},
        {"completion_window": "soon"},
    ],
)
def test_the_batch_api_provider_checks_its_own_options(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        make_provider("batch-api", base_url="http://127.0.0.1:9/v1", **options)
    with pytest.raises(ConfigurationError):
        BatchAPIBatchInference("http://127.0.0.1:9/v1", **options)
