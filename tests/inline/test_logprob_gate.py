"""One-token scoring (vLLM's ``logprob_token_ids``) and requests reading top alternatives never
share an engine step: in vLLM 0.32 the former turn the latter's alternatives into padding
(token 0 at -9999.0). The gate's rule on its own, and on the real engine: chat answers asking
``top_logprobs`` while 256 scoring requests run beside them are the answers they get alone."""

from __future__ import annotations

from types import SimpleNamespace

import anyio
import pytest

from batchclient import LogProbConfig, SamplingParams, VLLMBatchInference
from batchclient.inline._logprob_gate import LogprobGate, side_of

CHATS = [[{"role": "user", "content": f"Name a fruit, number {i}."}] for i in range(8)]
SCORES = [(f"The capital of country {i} is", " Paris") for i in range(64)] * 4


def test_which_requests_take_a_side() -> None:
    assert side_of(SimpleNamespace(logprob_token_ids=[5, 7], logprobs=None)) == "named"
    assert side_of(SimpleNamespace(logprob_token_ids=None, logprobs=3)) == "top"
    assert side_of(SimpleNamespace(logprob_token_ids=None, logprobs=0)) is None  # forced, chat
    assert side_of(SimpleNamespace(logprobs=None)) is None


async def test_one_side_at_a_time_and_neither_starves() -> None:
    gate = LogprobGate()
    seen: list[tuple[str, int]] = []
    overlaps = 0

    async def run(side: str, hold_s: float) -> None:
        nonlocal overlaps
        async with gate.enter(side):  # type: ignore[arg-type]
            seen.append((side, len(seen)))
            overlaps += gate.inside["named"] > 0 and gate.inside["top"] > 0
            await anyio.sleep(hold_s)

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(run, "named", 0.05)
        await anyio.sleep(0.01)
        tg.start_soon(run, "top", 0.01)  # waits for the named ones to drain
        await anyio.sleep(0.01)
        for _ in range(3):
            tg.start_soon(run, "named", 0.01)  # arrive later: after the waiting top one
        tg.start_soon(run, None, 0.0)  # type: ignore[arg-type]  # no side: never waits
    assert overlaps == 0
    order = [side for side, _ in seen if side is not None]
    assert order == ["named"] * 4 + ["top"] + ["named"] * 3
    assert gate.inside == {"named": 0, "top": 0}


def tops(result: object) -> list[list[list[tuple[str, float]]]]:
    return [
        [sorted(t.logprobs_by_token.items(), key=lambda kv: -kv[1]) for t in r.logprobs or []]
        for r in result.batch  # type: ignore[attr-defined]
    ]


@pytest.mark.engine
@pytest.mark.timeout(900)
async def test_top_logprobs_beside_one_token_scoring_are_as_alone(
    float32_client: VLLMBatchInference,
) -> None:
    # float32: in bfloat16 a near-tie among the alternatives moves with how the engine batched
    # (seen on an AVX-512 machine), so "as alone" could not be compared exactly
    model = (await float32_client.provider.models())[0]
    ask = {"sampling_params": SamplingParams(max_tokens=6), "logprobs": LogProbConfig(top_k=3)}
    alone = await float32_client.batch_chat_completion(model, CHATS, **ask)  # type: ignore[arg-type]
    mixed: dict[str, object] = {}

    async def chat() -> None:
        mixed["chat"] = await float32_client.batch_chat_completion(model, CHATS, **ask)  # type: ignore[arg-type]

    async def score() -> None:
        mixed["score"] = await float32_client.batch_loglikelihood(model, SCORES)

    async with anyio.create_task_group() as tg:
        tg.start_soon(score)
        await anyio.sleep(0.05)  # the scoring requests are in the engine first
        tg.start_soon(chat)
    together = tops(mixed["chat"])
    assert all(lp > -9999.0 for item in together for pos in item for _, lp in pos)
    assert all(len(pos) >= 3 for item in together for pos in item)
    # the same greedy tokens and alternatives as alone (values within numeric noise)
    for a, b in zip(tops(alone), together, strict=True):
        assert [[t for t, _ in pos] for pos in a] == [[t for t, _ in pos] for pos in b]
    assert not mixed["score"].errors  # type: ignore[attr-defined]
