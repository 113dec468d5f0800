"""One-token continuations on the inline engine: scored by a generation request over the context
(``logprob_token_ids``), which reads the prefix cache, they get exactly the scores of the
``prompt_logprobs`` way (``single_token_scoring=False``), in float32, on one engine whose
provider is switched between the two ways.

- eight MMLU-style questions (options listed, choices ``" A"`` to ``" D"``) after a shared
  five-shot prefix: every log-likelihood equal to the last bit, every ``is_greedy`` the same, and
  the other choices of a question read the context from the cache;
- one call mixing one-token and longer continuations keeps input order;
- the greedy token (as ``prompt_logprobs`` ranks it) is ``is_greedy``, another token is not.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from batchclient import VLLMBatchInference
from batchclient._core.scoring import loglikelihood_requests
from providers import MODEL, tokenizer

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

QUESTIONS = 8  # 32 scores each way: the prompt_logprobs way takes seconds per long context
LETTERS = ["A", "B", "C", "D"]


def _lettered(row: dict[str, Any]) -> str:
    options = "".join(f"\n{k}. {c}" for k, c in zip(LETTERS, row["choices"], strict=True))
    return f"Question: {row['question']}{options}\nAnswer:"


def mmlu_pairs() -> list[tuple[str, str]]:
    """``QUESTIONS`` questions of ``tests/evals/mc.jsonl`` x 4 letter choices, after five shots
    (the first five rows, answered): every context shares a prefix of over one KV block."""
    path = Path(__file__).parents[1] / "evals" / "mc.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    shots = "".join(f"{_lettered(r)} {LETTERS[r['answer']]}\n\n" for r in rows[:5])
    header = "The following are multiple choice questions about the world.\n\n"
    return [
        (header + shots + _lettered(row), f" {letter}")
        for row in rows[5 : 5 + QUESTIONS]
        for letter in LETTERS
    ]


@pytest.fixture
def engine(float32_client: VLLMBatchInference) -> VLLMBatchInference:
    """The session's float32 engine (in bfloat16 a score's last bits move with how the engine
    batched it, so two ways could not be compared exactly)."""
    return float32_client


async def both_ways(engine: VLLMBatchInference, pairs: list[Any]) -> tuple[Any, Any]:
    """The scores with single-token scoring on (the default), then off."""
    provider = engine.provider
    assert provider.single_token_scoring
    fast = await engine.batch_loglikelihood(MODEL, pairs, raise_on_error=True)
    provider.single_token_scoring = False
    try:
        slow = await engine.batch_loglikelihood(MODEL, pairs, raise_on_error=True)
    finally:
        provider.single_token_scoring = True
    return fast.batch, slow.batch


async def test_letter_choices_score_exactly_as_prompt_logprobs_do(
    engine: VLLMBatchInference,
) -> None:
    pairs = mmlu_pairs()
    ids = tokenizer()
    for context, letter in pairs[:4]:  # one token each, as lm-eval tokenises the pair
        assert len(ids(context + letter).input_ids) == len(ids(context).input_ids) + 1
    fast, slow = await both_ways(engine, pairs)
    assert [r.logprob for r in fast] == [r.logprob for r in slow]  # exact, not approximately
    assert [r.is_greedy for r in fast] == [r.is_greedy for r in slow]
    assert all(r.num_tokens == 1 for r in fast)
    assert any(r.is_greedy for r in fast) and not all(r.is_greedy for r in fast)


async def test_the_one_token_way_reads_the_prefix_cache(engine: VLLMBatchInference) -> None:
    """The same request, sent twice: the second reads the context from the cache (the
    ``prompt_logprobs`` way never does), and its answer holds the continuation's position only."""
    [(context, letter)] = mmlu_pairs()[:1]
    encoded = tokenizer()(context + letter).input_ids
    pair = (encoded[:-1], encoded[-1:])
    [request] = loglikelihood_requests(MODEL, [pair], 2048, None)
    first = await engine.provider.execute(request)
    again = await engine.provider.execute(request)
    assert first.body is not None and again.body is not None
    usage = again.body["usage"]
    assert usage["prompt_tokens"] == len(encoded) - 1
    block = 128  # vLLM's CPU KV block: whole blocks are cached
    assert usage["prompt_tokens_details"]["cached_tokens"] >= (len(encoded) - 2) // block * block
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    entries = again.body["choices"][0]["prompt_logprobs"]
    assert len(entries) == len(encoded) and entries[:-1] == [None] * (len(encoded) - 1)
    assert str(encoded[-1]) in entries[-1]


async def test_mixed_continuations_keep_input_order(engine: VLLMBatchInference) -> None:
    contexts = [c for c, _ in mmlu_pairs()[:: 4 * 4]]  # two questions
    continuations = [" A", " Paris, the capital", " B", " 42", " yes it is", " D"]
    pairs = [(ctx, cont) for ctx in contexts for cont in continuations]
    fast, slow = await both_ways(engine, pairs)
    lengths = [r.num_tokens for r in fast]
    assert 1 in lengths and max(lengths) > 1
    assert lengths == [r.num_tokens for r in slow]
    # one-token choices are the same computation both ways: equal; a longer one is scored by
    # teacher-forced steps over the cached context, equal within 1e-4 (the CPU's kernels may
    # round a cached block's attention differently: 3e-6 seen on an AVX2-only machine)
    for got, want in zip(fast, slow, strict=True):
        if got.num_tokens == 1:
            assert got.logprob == want.logprob
        else:
            assert abs(got.logprob - want.logprob) <= 1e-4, (got, want)
    assert [r.is_greedy for r in fast] == [r.is_greedy for r in slow]
    assert len({r.logprob for r in fast}) == len(pairs)  # each its own score, in its place


async def test_the_greedy_token_is_greedy(engine: VLLMBatchInference) -> None:
    context = "The capital of France is"
    ids = tokenizer()(context).input_ids
    # the greedy next token, as the prompt_logprobs way ranks it: rank 1 at that position
    engine.provider.single_token_scoring = False
    try:
        [request] = loglikelihood_requests(MODEL, [(ids, [0])], 2048, None)
        result = await engine.provider.execute(request)
    finally:
        engine.provider.single_token_scoring = True
    assert result.body is not None
    step = result.body["choices"][0]["prompt_logprobs"][len(ids)]
    [greedy] = [int(t) for t, v in step.items() if v["rank"] == 1]
    other = next(t for t in (0, 1, 2) if t != greedy)
    got = await engine.batch_loglikelihood(MODEL, [(ids, [greedy]), (ids, [other])])
    best, worse = got.batch
    assert best.is_greedy is True and worse.is_greedy is False
    assert best.logprob == step[str(greedy)]["logprob"]
    assert best.logprob is not None and worse.logprob is not None
    assert worse.logprob < best.logprob


async def test_a_questions_choices_are_scored_in_one_engine_request(
    engine: VLLMBatchInference,
) -> None:
    """The four choices of a question, in flight together, share one engine request (one pass
    over the context) and get the scores each gets alone; a token outside the vocabulary among
    them fails alone."""
    ids = tokenizer()
    text = mmlu_pairs()[0][0]
    context = ids(text).input_ids
    letters = [ids(f"{text} {x}").input_ids[-1] for x in LETTERS]
    pairs = [(context, [t]) for t in letters]
    together = await engine.batch_loglikelihood(MODEL, pairs, raise_on_error=True)
    alone = [
        (await engine.batch_loglikelihood(MODEL, [pair], raise_on_error=True)).batch[0]
        for pair in pairs
    ]
    assert [r.logprob for r in together.batch] == [r.logprob for r in alone]
    assert [r.is_greedy for r in together.batch] == [r.is_greedy for r in alone]

    requests = loglikelihood_requests(MODEL, [*pairs, (context, [len(ids) + 7])], 2048, None)
    *good, bad = await asyncio.gather(*(engine.provider.execute(r) for r in requests))
    assert all(r.error is None and r.body is not None for r in good)
    assert len({r.request_id for r in good}) == 1  # one engine request for the four
    details = [r.body["usage"]["prompt_tokens_details"] for r in good]  # type: ignore[index]
    assert [d["cached_tokens"] for d in details[1:]] == [len(context)] * 3
    assert bad.error is not None and bad.error.code == "invalid_request"
