"""The inline provider on the real in-process vLLM engine (bundled SmolLM2, 2,048-token
context): lifecycle, request mapping, per-item errors, metrics and the window. What every
provider must do is in ``test_contract.py``."""

from __future__ import annotations

import json
from typing import Any

import anyio
import jsonschema
import psutil
import pytest
from openai.types.chat import ChatCompletion

from batchclient import (
    LogProbConfig,
    ModelNotFoundError,
    Request,
    SamplingParams,
    VLLMBatchInference,
)
from batchclient._core.decode import to_response
from batchclient.models import bundled_model_path
from batchclient.types import StopReason

pytestmark = pytest.mark.engine

MODEL = "smollm2"
HI = [{"role": "user", "content": "Say hi."}]


async def run_body(client: VLLMBatchInference, index: int, body: dict[str, Any]) -> Any:
    """One raw OpenAI body through the provider, as jobs send them."""
    return await client.provider.execute(Request(index=index, body=body))


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": HI, "max_tokens": 4, "temperature": 0, **fields}


def _is_resource_tracker(proc: psutil.Process) -> bool:
    try:
        return "multiprocessing.resource_tracker" in " ".join(proc.cmdline())
    except psutil.Error:
        return False


@pytest.mark.heavy
async def test_starts_with_no_arguments_and_leaves_no_process_behind() -> None:
    """``VLLMBatchInference()`` must start on this machine with its defaults, answer, and on
    exit leave no engine process (Python's multiprocessing resource tracker, a per-interpreter
    helper that lives until the interpreter exits, is not the engine's)."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    async with VLLMBatchInference() as client:
        engine_tree = {p.pid for p in me.children(recursive=True)} - before
        engine_tree |= {p.pid for pid in engine_tree for p in _children(pid)}
        result = await client.batch_chat_completion(
            MODEL, [HI], sampling_params=SamplingParams(max_tokens=4)
        )
        assert result.batch[0].error is None and result.batch[0].text
        assert any(not _is_resource_tracker(psutil.Process(pid)) for pid in engine_tree)
    left = [p for p in me.children(recursive=True) if p.pid not in before]
    assert all(_is_resource_tracker(p) for p in left), left
    survivors = [
        pid
        for pid in engine_tree
        if psutil.pid_exists(pid)
        and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        and not _is_resource_tracker(psutil.Process(pid))
    ]
    assert survivors == []  # workers too, not only our direct children


def _children(pid: int) -> list[psutil.Process]:
    try:
        children: list[psutil.Process] = psutil.Process(pid).children(recursive=True)
        return children
    except psutil.Error:
        return []


async def test_model_names(inline_client: VLLMBatchInference) -> None:
    path = str(bundled_model_path())
    ok = await inline_client.batch_chat_completion(
        path, [HI], sampling_params=SamplingParams(max_tokens=2)
    )
    assert ok.batch[0].error is None
    with pytest.raises(ModelNotFoundError) as info:
        await inline_client.batch_chat_completion("other-model", [HI])
    assert "smollm2" in info.value.available
    # a job line naming another model is refused on its own, never run on the loaded one
    result = await run_body(inline_client, 0, body(model="no-such-model"))
    assert result.error.code == "model_not_found" and result.status_code == 404


async def test_answer_is_an_openai_chat_completion(inline_client: VLLMBatchInference) -> None:
    result = await run_body(inline_client, 0, body(logprobs=True, top_logprobs=3, max_tokens=6))
    assert result.status_code == 200 and result.error is None
    completion = ChatCompletion.model_validate(result.body)
    assert completion.object == "chat.completion" and completion.model == MODEL
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 6 or choice.finish_reason == "stop"
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    assert choice.logprobs is not None and choice.logprobs.content
    assert len(choice.logprobs.content) == completion.usage.completion_tokens
    assert "".join(t.token for t in choice.logprobs.content) == choice.message.content
    for token in choice.logprobs.content:
        assert len(token.top_logprobs) == 3
        ranked = [alt.logprob for alt in token.top_logprobs]
        assert ranked == sorted(ranked, reverse=True)
        assert token.logprob <= ranked[0] and token.logprob >= -9999.0
    # greedy: the chosen token is the best one
    assert all(t.token == t.top_logprobs[0].token for t in choice.logprobs.content)


async def test_metrics_tokens_ttft_and_latency(inline_client: VLLMBatchInference) -> None:
    result = await inline_client.batch_chat_completion(
        MODEL, [HI, HI], sampling_params=SamplingParams(max_tokens=8)
    )
    for item in result.batch:
        ttft, latency = item.metric("time_to_first_token"), item.metric("latency")
        assert ttft is not None and latency is not None
        assert 0 < ttft <= latency < 120
        prompt, completion = item.metric("prompt_tokens"), item.metric("completion_tokens")
        assert prompt is not None and completion is not None
        assert item.metric("total_tokens") == prompt + completion


async def test_request_ids_are_unique_and_not_the_callers(
    inline_client: VLLMBatchInference,
) -> None:
    results = [await run_body(inline_client, i, body(max_tokens=1)) for i in range(3)]
    ids = [r.request_id for r in results]
    assert len(set(ids)) == 3
    assert all(r.body["id"] == f"chatcmpl-{r.request_id}" for r in results)
    other = VLLMBatchInference()  # never started: only its id prefix matters
    assert not any(i.startswith(other.provider._id_prefix) for i in ids)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stream": True}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"n": 2}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"response_format": {"type": "xml"}}, "response_format"),
    ],
)
async def test_fields_the_engine_cannot_honour_are_refused_by_name(
    inline_client: VLLMBatchInference, fields: dict[str, Any], param: str
) -> None:
    result = await run_body(inline_client, 0, body(**fields))
    assert result.status_code == 400
    assert result.error.code == "unsupported_parameter"
    assert result.error.param == param and param in result.error.message
    assert result.body["error"]["code"] == "unsupported_parameter"
    assert result.body["error"]["param"] == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools"),
        ({"tools": {"name": "f"}}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
async def test_malformed_tools_in_a_body_are_per_item_invalid_request(
    inline_client: VLLMBatchInference, fields: dict[str, Any], param: str
) -> None:
    """Tools are served inline (``tests/core/test_structured.py``); a malformed ``tools`` or a
    ``tool_choice`` without tools in a raw body (a job line) is that item's 400."""
    result = await run_body(inline_client, 0, body(**fields))
    assert result.status_code == 400
    assert result.error.code == "invalid_request" and result.error.param == param


@pytest.mark.parametrize(
    ("fields", "param", "needle"),
    [
        ({"max_tokens": -5}, None, "max_tokens"),  # vLLM's own message
        ({"temperature": -1}, None, "temperature"),
        ({"top_p": 2.5}, None, "top_p"),
        ({"temperature": "hot"}, "temperature", "number"),
        ({"stop": [1, 2]}, "stop", "string"),
        ({"top_logprobs": 2}, "top_logprobs", "logprobs"),
        ({"messages": []}, "messages", "non-empty"),
    ],
)
async def test_invalid_values_are_per_item_invalid_request(
    inline_client: VLLMBatchInference, fields: dict[str, Any], param: str | None, needle: str
) -> None:
    result = await run_body(inline_client, 0, body(**fields))
    assert result.status_code == 400
    assert result.error.code == "invalid_request", result.error
    assert needle in result.error.message
    if param is not None:
        assert result.error.param == param
    assert set(result.body["error"]) == {"message", "type", "param", "code"}


async def test_prompt_plus_max_tokens_over_the_context_is_refused(
    inline_client: VLLMBatchInference,
) -> None:
    long = [{"role": "user", "content": "word " * 1900}]
    result = await run_body(inline_client, 0, body(messages=long, max_tokens=1000))
    assert result.status_code == 400
    assert result.error.code == "context_length_exceeded"
    assert result.body["error"]["param"] == "max_tokens"
    assert "2048" in result.error.message


async def test_without_max_tokens_generation_may_run_to_the_context(
    inline_client: VLLMBatchInference,
) -> None:
    """``max_tokens`` unset means up to the context (vLLM's server rule), never a fixed 16.
    With a prompt near the end of the context and ``ignore_eos`` the answer must fill it."""
    messages = [{"role": "user", "content": "word " * 1990}]
    request = body(messages=messages, ignore_eos=True)
    del request["max_tokens"]
    result = await run_body(inline_client, 0, request)
    assert result.error is None, result.error
    usage = result.body["usage"]
    assert usage["total_tokens"] == 2048 and usage["completion_tokens"] > 16
    assert result.body["choices"][0]["finish_reason"] == "length"


async def test_json_schema_and_grammar_constrain_the_answer(
    inline_client: VLLMBatchInference,
) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    sam = [{"role": "user", "content": "Sam is 41. Give his name and age as JSON."}]
    result = await inline_client.batch_chat_completion(
        MODEL,
        [sam, sam],
        sampling_params=SamplingParams(max_tokens=40),
        response_format={"type": "json_schema", "json_schema": schema},
    )
    for item in result.batch:
        assert item.error is None, item.error
        jsonschema.validate(json.loads(item.text), schema)
    answer = await run_body(
        inline_client,
        0,
        body(
            messages=[{"role": "user", "content": "Is water wet?"}],
            max_tokens=5,
            structured_outputs={"grammar": 'root ::= "yes" | "no"'},
        ),
    )
    assert answer.error is None, answer.error
    assert answer.body["choices"][0]["message"]["content"] in ("yes", "no")


async def test_seed_makes_sampling_repeatable(inline_client: VLLMBatchInference) -> None:
    story = [{"role": "user", "content": "Invent a word."}]
    fields = {"messages": story, "temperature": 1.0, "max_tokens": 12}
    same = [await run_body(inline_client, i, body(seed=7, **fields)) for i in range(2)]
    texts = [r.body["choices"][0]["message"]["content"] for r in same]
    assert texts[0] == texts[1]
    # and different seeds explore: at least one of a few differs from the seed-7 answer
    others = [await run_body(inline_client, 0, body(seed=s, **fields)) for s in (1, 2, 3)]
    assert any(r.body["choices"][0]["message"]["content"] != texts[0] for r in others)


async def test_the_window_bounds_requests_in_the_engine(
    inline_client: VLLMBatchInference,
) -> None:
    """120 conversations with a window of 48: never more than 48 engine requests at once,
    and the window is used."""
    peak = 0
    done = False

    async def watch() -> None:
        nonlocal peak
        while not done:
            peak = max(peak, inline_client.provider.engine_counts()[0])
            await anyio.sleep(0.01)

    conversations = [[{"role": "user", "content": f"Number {i}?"}] for i in range(120)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        result = await inline_client.batch_chat_completion(
            MODEL, conversations, sampling_params=SamplingParams(max_tokens=3)
        )
        done = True
    assert not result.errors
    assert peak == inline_client.provider.max_concurrency == 48


async def test_to_response_maps_finish_reasons(inline_client: VLLMBatchInference) -> None:
    request = Request(index=0, body=body(max_tokens=2))
    response = to_response(request, await inline_client.provider.execute(request))
    assert response.completion_message is not None
    assert response.completion_message.stop_reason == StopReason.out_of_tokens
    logprobs = await inline_client.batch_chat_completion(
        MODEL, [HI], sampling_params=SamplingParams(max_tokens=3), logprobs=LogProbConfig(top_k=2)
    )
    assert logprobs.batch[0].logprobs is not None and len(logprobs.batch[0].logprobs) == 3


def test_engine_defaults_start_anywhere_and_yield_to_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from batchclient.inline import _engine

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    args = _engine.engine_args("/m", "smollm2", True, {})
    assert args["model"] == "/m" and args["served_model_name"] == "smollm2"
    assert args["max_model_len"] == 2048 and args["disable_log_stats"] is True
    assert args["enforce_eager"] is True  # this machine runs the CPU build
    assert args["kv_cache_memory_bytes"] == 2 << 30
    assert args["dtype"] in ("bfloat16", "float32")  # by this CPU's flags (test_engine_defaults)
    given = _engine.engine_args("/m", "x", False, {"gpu_memory_utilization": 0.3, "dtype": "f"})
    assert "kv_cache_memory_bytes" not in given and "max_model_len" not in given
    assert given["gpu_memory_utilization"] == 0.3 and given["dtype"] == "f"
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert "kv_cache_memory_bytes" not in _engine.engine_args("/m", "x", True, {})
    assert _engine.engine_args("/m", "x", True, {"max_model_len": 512})["max_model_len"] == 512


async def test_unknown_engine_argument_is_a_configuration_error() -> None:
    from batchclient import ConfigurationError

    with pytest.raises(ConfigurationError, match="no_such_knob"):
        async with VLLMBatchInference(no_such_knob=1):
            pass


async def test_engine_start_failure_is_a_clear_endpoint_error(tmp_path: Any) -> None:
    from batchclient import EndpointError

    (tmp_path / "config.json").write_text("{}")  # a model folder vLLM cannot load
    with pytest.raises(EndpointError, match="failed to start"):
        async with VLLMBatchInference(str(tmp_path)):
            pass
