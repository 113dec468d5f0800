"""What every ``BatchInference`` provider must do, run against each of them: ``remote`` (the real
vLLM OpenAI server) and ``inline`` (the real in-process vLLM engine), both on the bundled
SmolLM2-135M-Instruct with a 2,048-token context.

Attribution is proven with prompt lengths (the bundled 135M model cannot be relied on to echo a
token): conversation i has a prompt length no other has, and its result must report exactly
that ``prompt_tokens``.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from batchclient import LogProbConfig, SamplingParams
from batchclient.types import StopReason, SystemMessage, TopPSamplingStrategy, UserMessage
from providers import MODEL, Provider, prompt_tokens


def distinct_conversations(n: int, tag: str) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"{tag} {i}: say something" + " ok" * (i + 1)}]
        for i in range(n)
    ]


# ---------------------------------------------------------------------------- the contract


async def test_results_come_back_in_input_order_with_their_own_answers(provider: Provider) -> None:
    """Order and attribution (vllm #394): early items ask for more tokens, so they finish
    last, and each result still lands at its own position."""
    n = 40
    conversations = distinct_conversations(n, "order")
    expected = [prompt_tokens(c) for c in conversations]
    assert len(set(expected)) == n
    params = [SamplingParams(max_tokens=2 + (n - i) % 13) for i in range(n)]
    async with provider.open() as client:
        result = await client.batch_chat_completion(
            MODEL, conversations, sampling_params=params, custom_ids=[f"r{i}" for i in range(n)]
        )
    assert len(result.batch) == n
    for i, item in enumerate(result.batch):
        assert item.error is None, item.error
        assert item.custom_id == f"r{i}"
        assert item.metric("prompt_tokens") == expected[i], f"item {i} has another's answer"
        completion = item.metric("completion_tokens")
        assert completion is not None and 1 <= completion <= params[i].max_tokens
        assert item.metric("total_tokens") == expected[i] + completion


async def test_prompt_longer_than_the_context_is_a_per_item_error(provider: Provider) -> None:
    huge = "word " * 200_000
    conversations = [
        [{"role": "user", "content": "Say hello."}],
        [{"role": "user", "content": huge}],
        [{"role": "user", "content": "Say goodbye."}],
    ]
    async with provider.open() as client:
        result = await client.batch_chat_completion(
            MODEL, conversations, sampling_params=SamplingParams(max_tokens=8)
        )
    assert len(result.batch) == 3
    assert result.batch[0].error is None and result.batch[0].text
    assert result.batch[2].error is None and result.batch[2].text
    err = result.batch[1].error
    assert err is not None
    assert err.code == "context_length_exceeded"
    assert err.status_code == 400
    assert result.batch[1].completion_message is None


async def test_prompt_plus_max_tokens_over_the_context_is_never_silently_truncated(
    provider: Provider,
) -> None:
    """A prompt that fits but leaves no room for ``max_tokens``: an error or an explicit
    ``length`` finish, never a truncated prompt."""
    conversation = [{"role": "user", "content": "word " * 1900}]
    tokens = prompt_tokens(conversation)
    async with provider.open() as client:
        result = await client.batch_chat_completion(
            MODEL, [conversation], sampling_params=SamplingParams(max_tokens=1000)
        )
    item = result.batch[0]
    if item.error is not None:
        assert item.error.code == "context_length_exceeded"
    else:
        assert item.completion_message is not None
        assert item.completion_message.stop_reason == StopReason.out_of_tokens
        assert item.metric("prompt_tokens") == tokens  # the whole prompt was read


async def test_cancelling_a_call_aborts_its_requests_in_the_engine(provider: Provider) -> None:
    conversations = [
        [{"role": "user", "content": f"Write a long story about the number {i}."}]
        for i in range(48)
    ]
    async with provider.open() as client:
        started = time.monotonic()
        with anyio.move_on_after(3.0):
            await client.batch_chat_completion(
                MODEL, conversations, sampling_params=SamplingParams(max_tokens=1500)
            )
        # The call ends promptly: uncancelled, 48 answers of up to 1,500 tokens take minutes.
        # The bound leaves room for a loaded 2-core machine, where the engine beside this
        # process starves the event loop while the cancellation unwinds (9.7 s seen once).
        assert time.monotonic() - started < 20.0
        await provider.assert_idle(client)


async def test_sampling_params_are_honoured(provider: Provider) -> None:
    counting = [{"role": "user", "content": "List the numbers from 1 to 30, separated by commas."}]
    hello = [{"role": "user", "content": "Tell me about the sea."}]
    async with provider.open() as client:
        free = await client.batch_chat_completion(
            MODEL,
            [counting, hello, hello, hello, hello],
            sampling_params=[
                SamplingParams(max_tokens=40),
                SamplingParams(max_tokens=1),
                SamplingParams(max_tokens=5),
                SamplingParams(max_tokens=17),
                SamplingParams(max_tokens=17),
            ],
        )
        stopped = await client.batch_chat_completion(
            MODEL, [counting, hello], sampling_params=SamplingParams(max_tokens=40, stop=[","])
        )
        sampled = await client.batch_chat_completion(
            MODEL,
            [hello] * 2,
            sampling_params=SamplingParams(
                max_tokens=8, strategy=TopPSamplingStrategy(temperature=0.8, top_p=0.9)
            ),
        )
    assert not free.errors and not stopped.errors and not sampled.errors
    # max_tokens: exactly that many tokens when generation ran out of them
    for item, limit in zip(free.batch[1:], (1, 5, 17, 17), strict=True):
        assert item.completion_message is not None
        completion = item.metric("completion_tokens")
        assert completion is not None and 1 <= completion <= limit
        if item.completion_message.stop_reason == StopReason.out_of_tokens:
            assert completion == limit
    # greedy (the default strategy) is deterministic, in one batch and across calls
    assert free.batch[3].text == free.batch[4].text
    assert free.batch[4].text.startswith(free.batch[2].text)
    # stop: the answer ends before the first stop string, which is not included
    unstopped = free.batch[0].text
    assert "," in unstopped, unstopped
    assert stopped.batch[0].text == unstopped.split(",")[0]
    assert stopped.batch[0].completion_message is not None
    assert stopped.batch[0].completion_message.stop_reason == StopReason.end_of_turn
    assert all(item.text for item in sampled.batch)


async def test_plain_dict_and_typed_messages_are_accepted(provider: Provider) -> None:
    conversations: list[list[Any]] = [
        [{"role": "user", "content": "Hi"}],
        [SystemMessage(content="You answer briefly."), UserMessage(content="Name a colour.")],
        [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Name a fruit."},
            {"role": "assistant", "content": "Apple."},
            {"role": "user", "content": [{"type": "text", "text": "Another one?"}]},
        ],
        [{"role": "wizard", "content": "not a role"}],
        [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    ]
    async with provider.open() as client:
        result = await client.batch_chat_completion(
            MODEL, conversations, sampling_params=SamplingParams(max_tokens=6)
        )
    assert len(result.batch) == 5
    for i in (0, 1, 2, 4):
        assert result.batch[i].error is None, result.batch[i].error
        assert result.batch[i].text
    assert result.batch[3].error is not None
    assert result.batch[3].error.code == "invalid_request"
    # the typed and the dict form of one conversation are one prompt
    assert result.batch[1].metric("prompt_tokens") == prompt_tokens(
        [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Name a colour."},
        ]
    )


async def test_concurrent_calls_share_the_provider_and_never_mix_results(
    provider: Provider,
) -> None:
    calls = {tag: distinct_conversations(12, tag) for tag in ("alpha", "beta-call", "g")}
    results: dict[str, Any] = {}
    async with provider.open() as client:

        async def run(tag: str) -> None:
            results[tag] = await client.batch_chat_completion(
                MODEL,
                calls[tag],
                sampling_params=SamplingParams(max_tokens=3),
                custom_ids=[f"{tag}-{i}" for i in range(12)],
            )

        async with anyio.create_task_group() as tg:
            for tag in calls:
                tg.start_soon(run, tag)
    for tag, conversations in calls.items():
        batch = results[tag].batch
        assert len(batch) == 12
        for i, item in enumerate(batch):
            assert item.error is None, item.error
            assert item.custom_id == f"{tag}-{i}"
            assert item.metric("prompt_tokens") == prompt_tokens(conversations[i])


GREEDY_PROMPTS = [
    "What is the capital of France?",
    "Explain photosynthesis in one sentence.",
    "Write a haiku about autumn.",
    "What is 12 times 7?",
    "Name three primary colours.",
    "Give me a tip for learning Python.",
    "Why is the sky blue?",
    "Describe a cat to someone who has never seen one.",
    "What does a compiler do?",
    "Suggest a name for a bakery.",
    "How many days are in a leap year?",
    "Translate 'good morning' into Spanish.",
    "What is the boiling point of water at sea level?",
    "Write one sentence about the moon.",
    "What is a prime number?",
    "List two uses of a paperclip.",
    "Who wrote Romeo and Juliet?",
    "What is the largest ocean on Earth?",
    "Give a synonym for happy.",
    "Explain what a database index is.",
]


NEAR_TIE_NATS = 0.5
"""A couple of bfloat16 steps of this model's logits (0.125-0.25 nats): greedy picks between
candidates this close flip with the batch's shape. Seen on this CPU with the bundled model in
bf16, on the server and the engine alike, and with raw ``vllm.LLM.chat`` (4 of these 20
prompts differ between one batch and one at a time; none in float32)."""


def _sampled_tokens(item: Any) -> list[str]:
    """The tokens a greedy answer chose: at each step the best candidate, and among tied
    best candidates the one the answer's text continues with."""
    tokens: list[str] = []
    rest = item.text
    for step in item.logprobs:
        best = max(step.logprobs_by_token.values())
        tied = [t for t, lp in step.logprobs_by_token.items() if lp == best]
        token = next((t for t in tied if t and rest.startswith(t)), tied[0])
        tokens.append(token)
        rest = rest[len(token) :] if rest.startswith(token) else rest
    return tokens


def _gap(item: Any, position: int, other: str) -> float:
    """How much better the answer's own choice at ``position`` was than ``other``."""
    step: dict[str, float] = item.logprobs[position].logprobs_by_token
    return max(step.values()) - step.get(other, -9999.0)


async def test_batched_and_one_at_a_time_greedy_answers_agree(provider: Provider) -> None:
    """20 prompts at temperature 0, as one batch and one at a time (vllm #1761, #5898,
    #27059 report batched answers that differ). Non-empty
    answers; wherever the two differ, the first difference is a numerical near-tie (both
    candidates within ``NEAR_TIE_NATS`` in both runs), so the first 8 tokens match for every
    prompt except at such ties. "At most 5 % diverge at all" does not hold in
    bfloat16 on this CPU even for raw vLLM (see ``NEAR_TIE_NATS``), so divergences are
    checked one by one instead of counted: a batching bug (padding, mixed-up requests) shows
    up as a first difference many nats apart."""
    conversations = [[{"role": "user", "content": p}] for p in GREEDY_PROMPTS]
    params = SamplingParams(max_tokens=24)
    top = LogProbConfig(top_k=5)
    async with provider.open() as client:
        batched = await client.batch_chat_completion(
            MODEL, conversations, sampling_params=params, logprobs=top
        )
        single = [
            (
                await client.batch_chat_completion(MODEL, [c], sampling_params=params, logprobs=top)
            ).batch[0]
            for c in conversations
        ]
    for i, (b, s) in enumerate(zip(batched.batch, single, strict=True)):
        assert b.error is None and s.error is None, (b.error, s.error)
        assert b.text.strip() and s.text.strip(), i
        b_tokens, s_tokens = _sampled_tokens(b), _sampled_tokens(s)
        if b_tokens == s_tokens:
            continue
        pairs = enumerate(zip(b_tokens, s_tokens, strict=False))
        first = next((k for k, (x, y) in pairs if x != y), None)
        assert first is not None, (i, "one answer is a truncation of the other", b.text, s.text)
        gaps = (_gap(s, first, b_tokens[first]), _gap(b, first, s_tokens[first]))
        assert max(gaps) <= NEAR_TIE_NATS, (i, first, gaps, b.text, s.text)
