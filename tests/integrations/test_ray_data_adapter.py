"""The Ray Data callable class over any provider, called the way ``map_batches`` calls it (a
``pyarrow`` or ``pandas`` batch) but without a Ray cluster; and the Ray provider's arguments.
The real cluster runs are in ``test_ray.py``."""

from __future__ import annotations

import argparse
from typing import Any

import pyarrow as pa
import pytest

from batchclient import ConfigurationError, Provider, Request, Result, failed
from batchclient.cli._providers import make_provider
from batchclient.cli._run import add_run_arguments
from batchclient.distributed import RayProvider
from batchclient.errors import ErrorCode
from batchclient.inline import VLLMProvider
from batchclient.integrations.ray_data import OUTPUT_COLUMNS, ChatPredictor
from batchclient.types import Endpoint


class Echo(Provider):
    """Answers with the last message; refuses a conversation that says ``fail``."""

    started = 0

    async def start(self) -> None:
        Echo.started += 1

    async def execute(self, request: Request) -> Result:
        text = request.body["messages"][-1]["content"]
        if text == "fail":
            return failed(ErrorCode.invalid_request, "refused", status_code=400)
        if text == "raise":
            raise RuntimeError("provider bug")
        return Result(
            status_code=200,
            body={
                "id": f"e{request.index}",
                "object": "chat.completion",
                "model": request.body["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": text.upper()},
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            },
        )


def chat(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_conversations_get_answers_and_bad_rows_get_errors() -> None:
    predictor = ChatPredictor(Echo, model="echo", sampling={"max_tokens": 4})
    batch = pa.Table.from_pylist(
        [
            {"id": 0, "messages": chat("hi")},
            {"id": 1, "messages": chat("fail")},
            {"id": 2, "messages": []},  # malformed: never sent
            {"id": 3, "messages": chat("raise")},
            {"id": 4, "messages": chat("ok")},
        ]
    )
    out = predictor(batch).to_pylist()
    assert [r["id"] for r in out] == [0, 1, 2, 3, 4]  # input order, input columns kept
    assert all(set(OUTPUT_COLUMNS) <= set(r) for r in out)
    assert (out[0]["answer"], out[0]["error_code"], out[0]["completion_tokens"]) == ("HI", None, 1)
    assert out[1]["error_code"] == "invalid_request" and out[1]["answer"] is None
    assert out[2]["error_code"] == "invalid_request" and "messages" in out[2]["error_message"]
    assert out[3]["error_code"] == "internal_error"  # a provider that raises fails one row
    assert out[4]["answer"] == "OK"


def test_openai_batch_lines_and_pandas_batches() -> None:
    predictor = ChatPredictor(Echo)
    lines = [
        {"custom_id": "a", "body": {"model": "m", "messages": chat("x")}},
        {"custom_id": "b", "body": {"model": "m"}},  # no messages: the validator's code
        {
            "custom_id": "c",
            "body": '{"model": "m", "messages": [{"role": "user", "content": "j"}]}',
        },
    ]
    out = predictor(pa.Table.from_pylist(lines[:2]).to_pandas()).to_pylist()
    assert out[0]["answer"] == "X" and out[0]["custom_id"] == "a"
    assert out[1]["error_code"] == "missing_required_parameter"
    json_body = predictor(pa.Table.from_pylist([lines[2]])).to_pylist()
    assert json_body[0]["answer"] == "J"


def test_one_provider_per_predictor() -> None:
    before = Echo.started
    predictor = ChatPredictor(Echo, model="echo")
    for _ in range(3):
        predictor(pa.Table.from_pylist([{"messages": chat("a")}]))
    assert Echo.started == before + 1


def test_ray_provider_arguments_are_checked_before_anything_starts() -> None:
    with pytest.raises(ConfigurationError):
        RayProvider(replicas=0)
    with pytest.raises(ConfigurationError):
        RayProvider(max_concurrency=0)
    with pytest.raises(ConfigurationError):
        RayProvider(cores_per_replica=0)
    provider = RayProvider(replicas=3, max_concurrency=8)
    assert provider.max_in_flight() == 24
    # the replicas' dtype (by this CPU) changes answers: part of the identity
    dtype = VLLMProvider().dtype
    assert provider.identity() == {"provider": "ray", "model": "smollm2", "dtype": dtype}


async def test_ray_provider_serves_what_its_engines_serve() -> None:
    """Before the replicas report, the engine arguments decide, as for the inline provider:
    chat, completions and scoring, or embeddings on a pooling engine."""
    generate = RayProvider()
    assert generate.endpoints == {Endpoint.chat_completions, Endpoint.completions}
    pooling = RayProvider(runner="pooling", convert="embed")
    assert pooling.endpoints == {Endpoint.embeddings}
    assert pooling.identity() == {
        "provider": "ray",
        "model": "smollm2",
        "dtype": VLLMProvider().dtype,
        "runner": "pooling",
    }
    with pytest.raises(ConfigurationError, match="not running"):
        await generate.tokenizer("smollm2")


def test_cli_builds_a_ray_provider() -> None:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    args = parser.parse_args(
        [
            "in.jsonl", "-o", "out.jsonl", "--provider", "ray", "--replicas", "2",
            "--address", "auto", "--resources-per-replica", "num_cpus=2",
            "--engine-arg", "max_model_len=1024", "--max-concurrency", "16",
        ]
    )  # fmt: skip
    provider = make_provider(args)
    assert isinstance(provider, RayProvider)
    assert (provider.replicas, provider.address, provider.max_concurrency) == (2, "auto", 16)
    assert provider.resources_per_replica == {"num_cpus": 2}
    assert provider.engine_args == {"max_model_len": 1024}
    bad = parser.parse_args(["in.jsonl", "-o", "o", "--provider", "ray", "--engine-arg", "x"])
    with pytest.raises(ConfigurationError):
        make_provider(bad)
