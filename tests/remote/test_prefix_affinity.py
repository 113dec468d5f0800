"""Prefix affinity across replicas: requests that share a prefix (the leading messages of a
chat, the context of a scoring request) go to the same endpoint while it has room, and spill
in the prefix's own ranking when it is full; against counting loopback stub servers."""

from __future__ import annotations

from collections import defaultdict

from batchclient import RemoteBatchInference
from batchclient._core.prefix import group_by_prefix, prefix_key
from batchclient._core.request import Request
from batchclient.testing import StubServer
from batchclient.types import Endpoint


def shots(system: str, question: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": question},
    ]


def test_the_prefix_key_is_the_context_or_the_leading_messages() -> None:
    def chat(messages: list[dict[str, str]]) -> Request:
        return Request(0, {"model": "m", "messages": messages})

    def score(prompt: list[int], start: int) -> Request:
        body = {"model": "m", "prompt": prompt}
        return Request(0, body, Endpoint.completions, score_span=(start, len(prompt)))

    assert prefix_key(chat(shots("s", "a"))) == prefix_key(chat(shots("s", "b")))
    assert prefix_key(chat(shots("s", "a"))) != prefix_key(chat(shots("t", "a")))
    assert prefix_key(chat([{"role": "user", "content": "a"}])) is None  # nothing shared
    assert prefix_key(score([1, 2, 3, 7], 3)) == prefix_key(score([1, 2, 3, 8, 9], 3))
    assert prefix_key(score([1, 2, 3, 7], 3)) != prefix_key(score([1, 2, 4, 7], 3))
    assert prefix_key(score([7], 0)) is None
    text = Request(0, {"model": "m", "prompt": "hi"}, Endpoint.completions)
    assert prefix_key(text) is None


async def endpoints_of_each_prefix(affinity: bool) -> dict[str, set[int]]:
    """10 system prompts x 5 questions, interleaved (load alone would spread each prefix),
    over 3 endpoints: which endpoints saw each system prompt."""
    stubs = [StubServer(latency_s=0.02, record_bodies=True).start() for _ in range(3)]
    try:
        systems = [f"system prompt {k}" for k in range(10)]
        convos = [shots(s, f"q{i}") for i in range(5) for s in systems]
        async with RemoteBatchInference(
            [s.url for s in stubs], max_concurrency=64, adaptive=False, prefix_affinity=affinity
        ) as client:
            result = await client.batch_chat_completion("smollm2", convos)
    finally:
        for s in stubs:
            s.stop()
    assert all(r.error is None for r in result.batch)
    where: dict[str, set[int]] = defaultdict(set)
    for n, stub in enumerate(stubs):
        for body in stub.stats.bodies:
            where[body["messages"][0]["content"]].add(n)
    assert len(where) == 10
    return where


async def test_requests_sharing_a_prefix_land_on_one_endpoint_while_it_has_room() -> None:
    where = await endpoints_of_each_prefix(affinity=True)
    assert all(len(places) == 1 for places in where.values())  # each prefix on one endpoint
    assert len(set().union(*where.values())) > 1  # and the prefixes spread over endpoints


async def test_without_affinity_a_prefix_goes_wherever_load_sends_it() -> None:
    where = await endpoints_of_each_prefix(affinity=False)
    assert sum(len(places) > 1 for places in where.values()) >= 5


async def test_a_full_endpoint_spills_in_the_prefix_ranking() -> None:
    """Three endpoints of 2 slots, four requests of one prefix at once: the first-ranked and
    the second-ranked endpoint take two each and the third none (load alone would have used
    all three)."""
    # 1 s answers: the four requests overlap however slowly a busy machine sends them
    stubs = [StubServer(latency_s=1.0).start() for _ in range(3)]
    try:
        async with RemoteBatchInference(
            [s.url for s in stubs], max_concurrency=2, adaptive=False
        ) as client:
            result = await client.batch_chat_completion(
                "smollm2", [shots("shared", f"q{i}") for i in range(4)]
            )
            # unkeyed requests still go least-loaded: one conversation of one message each
            spread = await client.batch_chat_completion(
                "smollm2", [[{"role": "user", "content": f"n{i}"}] for i in range(3)]
            )
    finally:
        for s in stubs:
            s.stop()
    assert all(r.error is None for r in result.batch + spread.batch)
    counts = sorted(s.stats.max_in_flight for s in stubs)
    assert counts == [1, 2, 2]  # the third endpoint saw only the unkeyed request
    assert sorted(s.stats.requests for s in stubs) == [1, 3, 3]


def test_grouping_moves_a_prefix_next_to_its_first_within_the_look_ahead() -> None:
    def chat(i: int, system: str | None) -> Request:
        messages = shots(system, f"q{i}") if system else [{"role": "user", "content": f"q{i}"}]
        return Request(i, {"model": "m", "messages": messages})

    systems = ["a", "b", None, "a", "b", None, "a"]
    order = [r.index for r in group_by_prefix([chat(i, s) for i, s in enumerate(systems)])]
    assert order == [0, 3, 6, 1, 4, 2, 5]
    # bounded: nothing moves across look-ahead runs (here 4: [0..3] then [4..6])
    order = [r.index for r in group_by_prefix([chat(i, s) for i, s in enumerate(systems)], 4)]
    assert order == [0, 3, 1, 2, 4, 5, 6]
    unshared = [chat(i, None) for i in range(5)]
    assert list(group_by_prefix(unshared)) == unshared


async def test_a_batch_sends_shared_prefixes_together_and_answers_in_input_order() -> None:
    """One request at a time at the server: it sees each prefix's requests in a row, the
    caller gets its results in input order."""
    with StubServer(record_bodies=True) as stub:
        convos = [shots(f"system {i % 3}", f"q{i}") for i in range(9)]
        async with RemoteBatchInference(stub.url, max_concurrency=1, adaptive=False) as client:
            result = await client.batch_chat_completion("smollm2", convos)
    seen = [body["messages"][0]["content"] for body in stub.stats.bodies]
    assert seen == ["system 0"] * 3 + ["system 1"] * 3 + ["system 2"] * 3
    assert [r.text for r in result.batch] == [f"echo: q{i}" for i in range(9)]
