"""Remote embeddings in groups against the loopback stub (real sockets): several inputs per
``/v1/embeddings`` request, each input still its own result, error, custom_id, cache entry and
token count; a refused group split until only the bad input fails; a malformed answer a
per-item error."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import anyio
import pytest

from batchclient import ConfigurationError, ErrorCode, RemoteBatchInference
from batchclient._core.request import Result
from batchclient.remote._embed_groups import split_result
from batchclient.testing import Fault, StubReply, StubServer
from batchclient.testing._stub_answers import embedding_body, stub_vector
from jobs_util import FAST

TEXTS = [f"input number {i}" for i in range(50)]


def remote(stub: StubServer, tmp_path: Path, **kw: Any) -> RemoteBatchInference:
    return RemoteBatchInference(stub.url, state_dir=tmp_path / "state", **{**FAST, **kw})


def inputs_sent(stub: StubServer) -> list[Any]:
    return [b["input"] for b in stub.stats.bodies]


@pytest.mark.parametrize("group", [1, 8, 16])
async def test_n_inputs_take_ceil_n_over_group_requests(tmp_path: Path, group: int) -> None:
    ids = [f"id-{i}" for i in range(len(TEXTS))]
    with StubServer(record_bodies=True) as stub:
        async with remote(stub, tmp_path, embedding_group_size=group) as client:
            got = await client.batch_embeddings("smollm2", TEXTS, custom_ids=ids)
    assert stub.stats.requests == math.ceil(len(TEXTS) / group)
    assert not got.errors
    assert [r.custom_id for r in got.batch] == ids
    for text, vector in zip(TEXTS, got.embeddings, strict=True):  # order kept
        assert vector == pytest.approx(stub_vector(text))
    sent = inputs_sent(stub)
    if group > 1:
        assert all(isinstance(i, list) for i in sent) and max(len(i) for i in sent) == group
    # token accounting per item: the stub counts one token per word, three per input here
    tokens = [m.value for r in got.batch for m in r.metrics or () if m.metric == "prompt_tokens"]
    assert tokens == [3] * len(TEXTS)


async def test_token_ids_are_grouped_apart_from_text(tmp_path: Path) -> None:
    inputs: list[str | list[int]] = ["a b", [1, 2, 3], "c", [4]]
    with StubServer(record_bodies=True) as stub:
        async with remote(stub, tmp_path) as client:
            got = await client.batch_embeddings("smollm2", inputs)
    assert not got.errors
    assert sorted(map(json.dumps, inputs_sent(stub))) == sorted(
        map(json.dumps, [["a b", "c"], [[1, 2, 3], [4]]])
    )
    assert got.embeddings[1] == pytest.approx(stub_vector([1, 2, 3]))


async def test_a_refused_group_is_split_until_only_the_bad_input_fails(tmp_path: Path) -> None:
    too_long = StubReply(
        status=400,
        body={"error": {"message": "input is too long for the context", "type": "BadRequest"}},
    )
    texts = [*TEXTS[:16]]
    texts[5] = "TOO-LONG input"
    with StubServer(record_bodies=True, faults=[Fault(too_long, match="TOO-LONG")]) as stub:
        async with remote(stub, tmp_path, embedding_group_size=16) as client:
            got = await client.batch_embeddings(
                "smollm2", texts, custom_ids=[f"c{i}" for i in range(16)]
            )
    assert [i for i, _ in got.errors] == [5]
    error = got.batch[5].error
    assert error is not None and error.status_code == 400 and "too long" in error.message
    assert got.batch[5].custom_id == "c5"
    for i, text in enumerate(texts):
        if i != 5:
            assert got.batch[i].embedding == pytest.approx(stub_vector(text))
    # 16 -> 8+8 -> 4+4 -> 2+2 -> 1+1: one request per level on the bad side, one good half each
    assert stub.stats.requests == 1 + 2 + 2 + 2 + 2
    assert stub.stats.by_status[400] == 5


async def test_a_413_is_split_too_and_other_refusals_are_every_inputs(tmp_path: Path) -> None:
    faults = [
        Fault(StubReply(status=413, body={"error": {"message": "too large"}}), match="BIG"),
        Fault(StubReply(status=401, body={"error": {"message": "bad key"}}), match="KEY"),
    ]
    with StubServer(record_bodies=True, faults=faults) as stub:
        async with remote(stub, tmp_path, embedding_group_size=4) as client:
            big = await client.batch_embeddings("smollm2", ["a", "b", "BIG", "c"])
            n = stub.stats.requests
            key = await client.batch_embeddings("smollm2", ["d", "KEY", "e"])
    assert [i for i, _ in big.errors] == [2]
    assert [i for i, _ in key.errors] == [0, 1, 2]  # not split: each input would get it too
    assert stub.stats.requests - n == 1


def _handler(reply: dict[str, Any]) -> Any:
    def handle(body: dict[str, Any], attempt: int) -> StubReply | None:
        if isinstance(body.get("input"), list) and len(body["input"]) == 4:
            answer = embedding_body(body)
            reply["edit"](answer)
            return StubReply(body=answer)
        return None

    return handle


@pytest.mark.parametrize(
    ("name", "edit", "bad"),
    [
        ("a vector short", lambda a: a["data"].pop(), [3]),
        ("an index missing", lambda a: a["data"][1].pop("index"), [1]),
        ("an index repeated", lambda a: a["data"][2].update(index=0), [0, 2]),
        ("no data", lambda a: a.pop("data"), [0, 1, 2, 3]),
    ],
)
async def test_a_malformed_group_answer_is_a_per_item_error(
    tmp_path: Path, name: str, edit: Any, bad: list[int]
) -> None:
    with StubServer(handler=_handler({"edit": edit})) as stub:
        async with remote(stub, tmp_path, embedding_group_size=4) as client:
            got = await client.batch_embeddings("smollm2", TEXTS[:4])
    assert [i for i, _ in got.errors] == bad, name
    assert all(e.code == ErrorCode.bad_upstream_response for _, e in got.errors)
    for i in set(range(4)) - set(bad):
        assert got.batch[i].embedding == pytest.approx(stub_vector(TEXTS[i]))


async def test_the_cache_keys_each_input(tmp_path: Path) -> None:
    with StubServer(record_bodies=True) as stub:
        async with remote(stub, tmp_path, cache=True, embedding_group_size=8) as client:
            first = await client.batch_embeddings("smollm2", TEXTS[:8])
            again = await client.batch_embeddings("smollm2", TEXTS[4:12])
    # only the four new inputs went out the second time (in how many groups depends on how
    # fast the scheduler handed them over: test_n_inputs_take_ceil_n_over_group_requests)
    sent = [x for g in inputs_sent(stub) for x in ([g] if isinstance(g, str) else g)]
    assert sent == TEXTS[:12]
    assert again.embeddings[:4] == first.embeddings[4:8]
    cached = [any(m.metric == "cached" for m in r.metrics or ()) for r in again.batch]
    assert cached == [True] * 4 + [False] * 4


async def test_a_batch_file_of_embedding_lines_is_grouped_and_answers_each_line(
    tmp_path: Path,
) -> None:
    lines = [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "smollm2", "input": text}}
        for i, text in enumerate(TEXTS[:12])
    ]  # fmt: skip
    lines.append({"custom_id": "two", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": "smollm2", "input": ["x y", "z"]}})  # fmt: skip
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    with StubServer(record_bodies=True) as stub:
        async with remote(stub, tmp_path, embedding_group_size=8) as client:
            record = await client.files.create(data)
            batch = await client.batches.create(record.id, endpoint="/v1/embeddings")
            with anyio.fail_after(30):
                batch = await client.batches.wait(batch.id)
            assert batch.output_file_id is not None
            out = await client.files.content(batch.output_file_id)
    rows = {r["custom_id"]: r for r in map(json.loads, out.splitlines())}
    assert set(rows) == {x["custom_id"] for x in lines}
    for i, text in enumerate(TEXTS[:12]):
        body = rows[f"e{i}"]["response"]["body"]
        assert [d["index"] for d in body["data"]] == [0]
        assert body["data"][0]["embedding"] == pytest.approx(stub_vector(text))
        assert body["usage"]["prompt_tokens"] == 3
    assert len(rows["two"]["response"]["body"]["data"]) == 2  # a list line is sent as it is
    assert stub.stats.requests < len(lines)
    assert ["x y", "z"] in inputs_sent(stub)


def test_token_shares_add_up_to_the_groups_usage() -> None:
    body: dict[str, Any] = {
        "object": "list",
        "data": [{"index": i, "embedding": [1.0]} for i in range(3)],
        "usage": {"prompt_tokens": 10, "total_tokens": 10},
    }
    parts = split_result(Result(status_code=200, body=body), ["aaaa", "a", "aaaaa"])
    shares = [p.body["usage"]["prompt_tokens"] for p in parts if p.body]
    assert sum(shares) == 10 and shares[2] >= shares[0] > shares[1]


def test_the_group_size_is_checked() -> None:
    bads: list[Any] = [0, -1, 2.5, True]
    for bad in bads:
        with pytest.raises(ConfigurationError, match="embedding_group_size"):
            RemoteBatchInference("http://127.0.0.1:9/v1", embedding_group_size=bad)
