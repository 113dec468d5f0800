"""Continuations of 2-16 tokens on the inline engine: scored by teacher forcing (one generation
request over the context that is made to generate the continuation's tokens, reading the prefix
cache), they get the scores of the ``prompt_logprobs`` way (``single_token_scoring=False``)
within 1e-4 and the same ``is_greedy``, in float32, on one engine whose provider is switched
between the two ways.

- numeric choices of 2-7 tokens after a shared five-shot prefix of over 400 tokens;
- a call mixing one-token and longer choices (engine steps that run both kinds at once);
- the request reads the cached context, and its answer has the continuation's positions only;
- a greedy generation, scored back, is greedy at every step, and its score is the sum of the
  generation's own log-probabilities;
- the end-of-text token inside a continuation is scored, not stopped at; a token outside the
  vocabulary is that item's ``invalid_request``; a continuation longer than 16 tokens is scored
  the ``prompt_logprobs`` way.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from batchclient import VLLMBatchInference
from batchclient._core.request import Request
from batchclient._core.scoring import loglikelihood_requests
from batchclient.inline._client import MAX_FORCED_TOKENS
from batchclient.types import Endpoint
from prefix_mc_task import DESCRIPTION, rows
from providers import MODEL, tokenizer

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

QUESTIONS = 5  # 20 scores each way: the prompt_logprobs way takes about a second per pair
TOLERANCE = 1e-4


def number_pairs() -> list[tuple[str, str]]:
    """``QUESTIONS`` questions x 4 numeric choices, in lm-eval's layout after five shots."""
    shots, questions = rows(QUESTIONS)
    prefix = DESCRIPTION + "".join(
        f"Question: {s['question']}\nAnswer: {s['choices'][s['answer']]}\n\n" for s in shots
    )
    return [
        (f"{prefix}Question: {q['question']}\nAnswer:", f" {choice}")
        for q in questions
        for choice in q["choices"]
    ]


async def both_ways(engine: VLLMBatchInference, pairs: list[Any]) -> tuple[Any, Any]:
    provider = engine.provider
    assert provider.single_token_scoring
    forced = await engine.batch_loglikelihood(MODEL, pairs, raise_on_error=True)
    provider.single_token_scoring = False
    try:
        plain = await engine.batch_loglikelihood(MODEL, pairs, raise_on_error=True)
    finally:
        provider.single_token_scoring = True
    return forced.batch, plain.batch


async def test_numeric_choices_score_as_prompt_logprobs_do(
    float32_client: VLLMBatchInference,
) -> None:
    pairs = number_pairs()
    ids = tokenizer()
    assert len(ids(pairs[0][0]).input_ids) > 400
    forced, plain = await both_ways(float32_client, pairs)
    lengths = [r.num_tokens for r in forced]
    assert min(lengths) >= 2 and max(lengths) <= MAX_FORCED_TOKENS
    assert lengths == [r.num_tokens for r in plain]
    diffs = [abs(a.logprob - b.logprob) for a, b in zip(forced, plain, strict=True)]
    assert max(diffs) <= TOLERANCE
    assert [r.is_greedy for r in forced] == [r.is_greedy for r in plain]
    assert len({round(r.logprob, 3) for r in forced}) > len(pairs) // 2  # real, varied scores


async def test_one_token_and_longer_choices_in_the_same_engine_steps(
    float32_client: VLLMBatchInference,
) -> None:
    """The local multiple-choice task (48 short questions, choices of 1-3 tokens), in one call:
    the one-token requests (``logprob_token_ids``) and the forced ones share engine steps,
    where vLLM answers every request in the one-token requests' terms."""
    path = Path(__file__).parents[1] / "evals" / "mc.jsonl"
    questions = [json.loads(line) for line in path.read_text().splitlines()]
    pairs = [
        (f"Question: {q['question']}\nAnswer:", f" {choice}")
        for q in questions
        for choice in q["choices"]
    ]
    forced, plain = await both_ways(float32_client, pairs)
    lengths = {r.num_tokens for r in forced}
    assert 1 in lengths and max(lengths) >= 2
    assert max(abs(a.logprob - b.logprob) for a, b in zip(forced, plain, strict=True)) <= TOLERANCE
    assert [r.is_greedy for r in forced] == [r.is_greedy for r in plain]
    assert any(r.is_greedy for r in plain)
    assert any(not r.is_greedy and r.num_tokens >= 2 for r in plain)


def _request(context: list[int], continuation: list[int]) -> Request:
    [request] = loglikelihood_requests(MODEL, [(context, continuation)], 2048, None)
    return request


async def test_the_forced_way_reads_the_prefix_cache(float32_client: VLLMBatchInference) -> None:
    context_text, choice = number_pairs()[0]
    ids = tokenizer()
    context = ids(context_text).input_ids
    continuation = ids(context_text + choice).input_ids[len(context) :]
    request = _request(context, continuation)
    provider = float32_client.provider
    first = await provider.execute(request)
    again = await provider.execute(request)
    assert first.body is not None and again.body is not None
    usage = again.body["usage"]
    assert usage["prompt_tokens"] == len(context) + len(continuation)
    block = 128  # vLLM's CPU KV block: whole blocks are cached
    assert usage["prompt_tokens_details"]["cached_tokens"] >= len(context) // block * block > 0
    entries = again.body["choices"][0]["prompt_logprobs"]
    assert entries[: len(context)] == [None] * len(context)
    assert all(str(t) in e for t, e in zip(continuation, entries[len(context) :], strict=True))
    assert len(entries) == len(context) + len(continuation)


async def test_a_greedy_generation_scores_greedy(float32_client: VLLMBatchInference) -> None:
    ids = tokenizer()
    context = ids("The three primary colours are red,").input_ids
    body = {
        "model": MODEL,
        "prompt": context,
        "max_tokens": 6,
        "temperature": 0.0,
        "logprobs": 1,
    }
    generated = await float32_client.provider.execute(
        Request(index=0, body=body, endpoint=Endpoint.completions)
    )
    assert generated.body is not None
    choice = generated.body["choices"][0]
    tokens = ids(choice["text"], add_special_tokens=False).input_ids
    # this prompt's greedy text tokenises back to the six tokens generated
    assert ids.decode(tokens) == choice["text"] and len(tokens) == 6
    pairs = [(context, tokens), (context, [*tokens[:-1], (tokens[-1] + 1) % 1000])]
    forced, plain = await both_ways(float32_client, pairs)
    assert forced[0].is_greedy is True and plain[0].is_greedy is True
    assert forced[1].is_greedy is False and plain[1].is_greedy is False
    own = sum(choice["logprobs"]["token_logprobs"])
    assert math.isclose(forced[0].logprob, own, abs_tol=TOLERANCE)
    assert abs(forced[1].logprob - plain[1].logprob) <= TOLERANCE


async def test_end_of_text_out_of_vocabulary_and_long_continuations(
    float32_client: VLLMBatchInference,
) -> None:
    ids = tokenizer()
    context = ids("Question: what comes after one?\nAnswer:").input_ids
    eos = ids.eos_token_id
    two = ids(" two", add_special_tokens=False).input_ids
    long = ids(" two, three, four, five, six, seven, eight, nine and ten", add_special_tokens=False)
    assert len(long.input_ids) > MAX_FORCED_TOKENS
    pairs: list[Any] = [(context, [*two, eos, *two]), (context, long.input_ids)]
    forced, plain = await both_ways(float32_client, pairs)
    for a, b in zip(forced, plain, strict=True):
        assert abs(a.logprob - b.logprob) <= TOLERANCE and a.is_greedy == b.is_greedy
    # the long one went the prompt_logprobs way: every position after the first has entries
    result = await float32_client.provider.execute(_request(context, long.input_ids))
    assert result.body is not None
    entries = result.body["choices"][0]["prompt_logprobs"]
    assert all(e is not None for e in entries[1:])

    got = await float32_client.batch_loglikelihood(
        MODEL, [(context, [*two, len(ids) + 5]), (context, two + two)]
    )
    bad, good = got.batch
    assert bad.error is not None and bad.error.code == "invalid_request"
    assert good.error is None and good.logprob is not None
