"""The merging of one-token scoring requests (``batchclient.inline._next_tokens``): requests
over one context in flight together make one scoring call whose tokens are theirs, each gets
its own token's result, and a refusal of the group is retried token by token. The engine side
(one engine request, scores equal to each alone) is ``tests/inline/test_single_token_scoring.py``'s;
here a recording scorer stands in for the engine so the grouping rules can be checked one by
one."""

from __future__ import annotations

import asyncio

import pytest

from batchclient._core.request import Result, failed
from batchclient.errors import ErrorCode
from batchclient.inline._next_tokens import MAX_NEXT_TOKENS, NextTokenGroups

BAD = 999
OWN = 998  # refused on its own, the others scored (as an id outside the vocabulary is)


class Scorer:
    """Scores token ``t`` as ``-t``; refuses a call holding ``BAD`` as vLLM refuses an id
    outside the vocabulary (the whole request)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []

    async def __call__(
        self, engine: object, model: str, context: list[int], tokens: list[int]
    ) -> list[Result]:
        self.calls.append((model, tuple(context), tuple(tokens)))
        await asyncio.sleep(0.01)
        if BAD in tokens:
            refusal = failed(ErrorCode.invalid_request, "bad token id", status_code=400)
            return [refusal for _ in tokens]
        return [
            failed(ErrorCode.invalid_request, "outside", status_code=400)
            if t == OWN
            else Result(200, {"token": t, "logprob": -t}, request_id=str(tokens))
            for t in tokens
        ]


async def test_choices_of_one_context_make_one_call_and_get_their_own_results() -> None:
    scorer = Scorer()
    groups = NextTokenGroups(scorer)
    jobs = [groups.execute(None, "m", [1, 2, 3], t) for t in (10, 11, 12, 13)]
    jobs += [groups.execute(None, "m", [1, 2, 4], 10), groups.execute(None, "other", [1, 2, 3], 10)]
    results = await asyncio.gather(*jobs)
    assert sorted(scorer.calls) == [
        ("m", (1, 2, 3), (10, 11, 12, 13)),
        ("m", (1, 2, 4), (10,)),
        ("other", (1, 2, 3), (10,)),
    ]
    assert [r.body["token"] for r in results] == [10, 11, 12, 13, 10, 10]  # type: ignore[index]
    assert len({r.request_id for r in results[:4]}) == 1


async def test_the_same_token_twice_is_scored_once_and_each_gets_its_own_body() -> None:
    scorer = Scorer()
    groups = NextTokenGroups(scorer)
    first, second = await asyncio.gather(
        groups.execute(None, "m", [5], 7), groups.execute(None, "m", [5], 7)
    )
    assert scorer.calls == [("m", (5,), (7,))]
    assert first.body == second.body and first.body is not second.body


async def test_requests_after_the_hold_make_a_new_call() -> None:
    scorer = Scorer()
    groups = NextTokenGroups(scorer, hold_s=0.002)
    await groups.execute(None, "m", [5], 7)
    await groups.execute(None, "m", [5], 8)
    assert scorer.calls == [("m", (5,), (7,)), ("m", (5,), (8,))]


async def test_a_full_group_is_sent_without_waiting_and_the_rest_go_in_another() -> None:
    scorer = Scorer()
    groups = NextTokenGroups(scorer, hold_s=60.0)  # only filling up can send the first
    tokens = list(range(MAX_NEXT_TOKENS + 1))
    tasks = [asyncio.ensure_future(groups.execute(None, "m", [5], t)) for t in tokens]
    done, _ = await asyncio.wait(tasks[:MAX_NEXT_TOKENS], timeout=30)
    assert len(done) == MAX_NEXT_TOKENS
    assert scorer.calls == [("m", (5,), tuple(tokens[:MAX_NEXT_TOKENS]))]
    assert not tasks[-1].done()  # the 129th opened a group of its own, still held
    tasks[-1].cancel()


async def test_a_refused_group_is_retried_token_by_token() -> None:
    scorer = Scorer()
    groups = NextTokenGroups(scorer)
    results = await asyncio.gather(*(groups.execute(None, "m", [5], t) for t in (1, BAD, 2)))
    assert scorer.calls[0] == ("m", (5,), (1, BAD, 2))
    assert sorted(scorer.calls[1:]) == [("m", (5,), (1,)), ("m", (5,), (2,)), ("m", (5,), (BAD,))]
    assert [r.error is None for r in results] == [True, False, True]
    assert results[1].error is not None and results[1].error.code == ErrorCode.invalid_request


async def test_a_token_refused_on_its_own_does_not_split_the_group() -> None:
    scorer = Scorer()
    groups = NextTokenGroups(scorer)
    results = await asyncio.gather(*(groups.execute(None, "m", [5], t) for t in (1, OWN, 2)))
    assert scorer.calls == [("m", (5,), (1, OWN, 2))]
    assert [r.error is None for r in results] == [True, False, True]


async def test_cancelled_callers_send_nothing() -> None:
    scorer = Scorer()
    groups = NextTokenGroups(scorer, hold_s=0.05)
    task = asyncio.ensure_future(groups.execute(None, "m", [5], 7))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.1)
    assert scorer.calls == []


async def test_a_scorer_that_raises_reaches_every_caller_instead_of_hanging() -> None:
    async def broken(
        engine: object, model: str, context: list[int], tokens: list[int]
    ) -> list[Result]:
        raise RuntimeError("scorer bug")

    groups = NextTokenGroups(broken)
    results = await asyncio.wait_for(
        asyncio.gather(
            *(groups.execute(None, "m", [5], t) for t in (1, 2)), return_exceptions=True
        ),
        timeout=30,
    )
    assert [str(r) for r in results] == ["scorer bug", "scorer bug"]
