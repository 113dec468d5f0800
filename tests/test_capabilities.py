"""The capability matrix: every provider × call kind × face runs the same contract, and the
expectations come from one table, :data:`CAPABILITIES`.

- **Providers**: ``remote`` (``RemoteBatchInference`` over the loopback stub), ``batch-api``
  (``BatchAPIBatchInference`` over a ``batchclient serve`` app whose own provider is the stub
  remote), ``anthropic-batch`` and ``gemini-batch`` (``AnthropicBatchInference`` and
  ``GeminiBatchInference`` over their Batch API stubs, through the real SDKs; chat only),
  ``inline`` (the session's generating vLLM engine), ``inline-pooling`` (the session's
  embedding engine) and ``ray`` (the session's ``RayBatchInference``: two replicas on a local
  Ray cluster).
- **Call kinds**: chat (``batch_chat_completion``), completions (``batch_completion``), scoring
  (``batch_loglikelihood`` over token ids; ``batch_loglikelihood_rolling`` is refused with it),
  embeddings (``batch_embeddings``), responses (``/v1/responses`` lines and
  ``POST /v1/responses``: no call of the protocol, so the job and server faces only; passed
  through where the provider speaks the Responses API, run as chat elsewhere) and moderations
  (``/v1/moderations`` lines and ``POST /v1/moderations``, passed through; no call either).
- **Faces**: ``call`` (the Python call), ``job`` (``client.files.create`` +
  ``client.batches.create`` of an OpenAI batch file for the kind's endpoint, then its output and
  error files and ``job_result``), ``server`` (``create_app`` over the client on loopback,
  driven by the openai SDK: ``/v1/files`` + ``/v1/batches``, and the one-request route of the
  endpoint).

Every cell sends 5 items, the third of them too long for the context (an overlong prompt; on
the stub an injected OpenAI ``context_length_exceeded`` refusal for it), and asserts: results in
input order under their ``custom_id``, the bad item a per-item ``context_length_exceeded`` error,
every other item a well-formed answer (on the Anthropic and Gemini stubs the bad item is the
provider's own per-request refusal, ``invalid_request``: ``BAD_CODES``). A cell the provider
cannot serve asserts the refusal instead: ``ConfigurationError`` naming the endpoint from the
call and from ``batches.create`` (nothing is sent), and on the server OpenAI's error envelope
(``POST /v1/batches``: 400, ``param`` ``endpoint``; the one-request route: 404).

The matrix of the cells that ran is printed at the end of the session (``capability_matrix.py``;
``BATCHCLIENT_MATRIX_OUT=path`` also writes it to a file). The stub cells run in the quick tier;
the engine and Ray cells are marked ``engine``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any, cast

import anyio
import openai
import pytest
from openai.types import Completion, CreateEmbeddingResponse, ModerationCreateResponse
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from batchclient import (
    AnthropicBatchInference,
    BatchAPIBatchInference,
    BatchClient,
    ConfigurationError,
    Endpoint,
    GeminiBatchInference,
    RemoteBatchInference,
    SamplingParams,
)
from batchclient._core.scoring import scoring_body
from batchclient.remote import RemoteProvider
from batchclient.server import create_app
from batchclient.testing import (
    AnthropicBatchStub,
    AppServer,
    Fault,
    GeminiBatchStub,
    StubReply,
    StubServer,
)
from capability_matrix import CELL
from jobs_util import FAST, jsonl

MODEL = "smollm2"
PROVIDERS = (
    "remote",
    "batch-api",
    "anthropic-batch",
    "gemini-batch",
    "inline",
    "inline-pooling",
    "ray",
)
KINDS = ("chat", "completions", "scoring", "embeddings", "responses", "moderations")
FACES = ("call", "job", "server")

OK = "ok"
REFUSED = "refused"
REFUSAL_CODE = {"call": "ConfigurationError", "job": "ConfigurationError", "server": "HTTP 400/404"}
"""What a refusal is on each face: the exception of the call and of ``batches.create``; the
server's status for ``POST /v1/batches`` (400, ``param`` ``endpoint``) and for the endpoint's
one-request route (404). None of them carries an error code today (``code`` is null in the
envelopes)."""

SERVES: dict[str, dict[str, str]] = {
    "remote": {"chat": OK, "completions": OK, "scoring": OK, "embeddings": OK, "responses": OK},
    "batch-api": {
        "chat": OK, "completions": OK, "scoring": OK, "embeddings": OK, "responses": OK
    },
    # Message Batches and Gemini batches carry chat requests only (responses run as chat)
    "anthropic-batch": {
        "chat": OK, "completions": REFUSED, "scoring": REFUSED, "embeddings": REFUSED,
        "responses": OK,
    },
    # Gemini batches embed too (one text per request)
    "gemini-batch": {
        "chat": OK, "completions": REFUSED, "scoring": REFUSED, "embeddings": OK,
        "responses": OK,
    },
    "inline": {
        "chat": OK, "completions": OK, "scoring": OK, "embeddings": REFUSED, "responses": OK
    },
    "inline-pooling": {
        "chat": REFUSED, "completions": REFUSED, "scoring": REFUSED, "embeddings": OK,
        "responses": REFUSED,
    },
    # the replica here generates: Ray replicas of a pooling engine embed
    # (tests/distributed/test_ray.py)
    "ray": {"chat": OK, "completions": OK, "scoring": OK, "embeddings": REFUSED, "responses": OK},
}  # fmt: skip

NO_CALL = frozenset({"responses", "moderations"})
"""Kinds without a call of the protocol: their cells are the job and server faces."""

for _provider, _serves in SERVES.items():  # moderations pass through to OpenAI-shaped servers
    _serves["moderations"] = OK if _provider in ("remote", "batch-api") else REFUSED

CELLS = [
    (provider, kind, face)
    for provider, kind, face in product(PROVIDERS, KINDS, FACES)
    if not (face == "call" and kind in NO_CALL)
]

CAPABILITIES: dict[tuple[str, str, str], str] = {
    (provider, kind, face): OK if SERVES[provider][kind] == OK else REFUSAL_CODE[face]
    for provider, kind, face in CELLS
}
"""The one table: ``(provider, kind, face) -> "ok"`` or the refusal's code on that face."""

KNOWN_DEFECTS: dict[tuple[str, str, str], str] = {}
"""Cells whose correct behaviour is asserted but not delivered yet (``xfail(strict=True)``)."""

N, BAD = 5, 2
BAD_CODE = "context_length_exceeded"
OVERLONG = "overlong " * 3000  # over every engine's max_model_len (2,048 inline, 1,024 others)
BAD_CODES = {"anthropic-batch": "invalid_request", "gemini-batch": "invalid_request"}
"""The bad item's code where it is not ``BAD_CODE``: Anthropic's over-long prompt is an
``invalid_request_error`` and Gemini's an ``INVALID_ARGUMENT``, both ``invalid_request``."""
OVERLONG_ID = 4321
MAX_TOKENS = 4
KEY = "sk-test"  # the Anthropic and Gemini stubs require it
WAIT_S = 300.0

# ------------------------------------------------------------------------------ the kinds


@dataclass(frozen=True)
class Kind:
    """One call kind: its items, its call, its request bodies and how an answer looks."""

    endpoint: Endpoint
    good: Callable[[int], Any]
    bad: Any
    call: Callable[[BatchClient, list[Any], list[str]], Awaitable[list[Any]]]
    check_item: Callable[[Any, Any], None]  # (item, decoded success)
    body: Callable[[Any], dict[str, Any]]
    check_body: Callable[[Any, dict[str, Any]], None]  # (item, OpenAI answer body)
    sdk: Callable[[openai.AsyncOpenAI, dict[str, Any]], Awaitable[Any]]
    size: Callable[[Any], float | None]  # of a decoded success: grows with the item's index
    body_size: Callable[[dict[str, Any]], int]  # the same, of an OpenAI answer body
    also_refused: Callable[[BatchClient], Awaitable[Any]] | None = None

    def items(self) -> list[Any]:
        return [self.bad if i == BAD else self.good(i) for i in range(N)]


def _tokens(response: Any) -> int:
    completion = response.metric("completion_tokens")
    assert completion is not None and 1 <= completion <= MAX_TOKENS, completion
    return int(completion)


async def _chat(client: BatchClient, items: list[Any], ids: list[str]) -> list[Any]:
    params = SamplingParams(max_tokens=MAX_TOKENS)
    return (await client.batch_chat_completion(MODEL, items, params, custom_ids=ids)).batch


def _check_chat(item: Any, got: Any) -> None:
    assert got.completion_message is not None and isinstance(got.text, str)
    _tokens(got)


def _check_chat_body(item: Any, body: dict[str, Any]) -> None:
    ChatCompletion.model_validate(body)
    assert isinstance(body["choices"][0]["message"]["content"], str)
    assert 1 <= body["usage"]["completion_tokens"] <= MAX_TOKENS


async def _completions(client: BatchClient, items: list[Any], ids: list[str]) -> list[Any]:
    params = SamplingParams(max_tokens=MAX_TOKENS)
    return (await client.batch_completion(MODEL, items, params, custom_ids=ids)).batch


def _check_completion(item: Any, got: Any) -> None:
    assert isinstance(got.content, str)
    _tokens(got)


def _check_completion_body(item: Any, body: dict[str, Any]) -> None:
    Completion.model_validate(body)
    assert isinstance(body["choices"][0]["text"], str)
    assert 1 <= body["usage"]["completion_tokens"] <= MAX_TOKENS


async def _scoring(client: BatchClient, items: list[Any], ids: list[str]) -> list[Any]:
    return (await client.batch_loglikelihood(MODEL, items, custom_ids=ids)).batch


def _check_score(item: Any, got: Any) -> None:
    assert got.num_tokens == len(item[1])
    assert math.isfinite(got.logprob) and got.logprob < 0
    assert isinstance(got.is_greedy, bool)


def _check_score_body(item: Any, body: dict[str, Any]) -> None:
    """The continuation's positions of the echoed prompt carry log-probabilities (no SDK
    type check: the SDK's ``Completion`` has no null log-probability, which an echoed prompt
    starts with)."""
    assert body["object"] == "text_completion"
    context, continuation = item
    logprobs = body["choices"][0]["logprobs"]["token_logprobs"]
    scored = logprobs[len(context) : len(context) + len(continuation)]
    assert len(scored) == len(continuation)
    assert all(isinstance(lp, float) and lp <= 0 for lp in scored), scored


async def _embeddings(client: BatchClient, items: list[Any], ids: list[str]) -> list[Any]:
    return (await client.batch_embeddings(MODEL, items, custom_ids=ids)).batch


def _check_embedding(item: Any, got: Any) -> None:
    assert got.vector and all(isinstance(v, float) for v in got.vector)


async def _no_call(client: BatchClient, items: list[Any], ids: list[str]) -> list[Any]:
    raise AssertionError("this kind has no call face")


def _check_response_body(item: Any, body: dict[str, Any]) -> None:
    response = Response.model_validate(body)
    assert isinstance(response.output_text, str) and response.usage is not None
    assert 1 <= response.usage.output_tokens <= MAX_TOKENS


def _check_moderation_body(item: Any, body: dict[str, Any]) -> None:
    response = ModerationCreateResponse.model_validate(body)
    assert len(response.results) == 1 and not response.results[0].flagged


def _check_embedding_body(item: Any, body: dict[str, Any]) -> None:
    CreateEmbeddingResponse.model_validate(body)
    vector = body["data"][0]["embedding"]
    assert vector and (isinstance(vector, str) or all(isinstance(v, float) for v in vector))


SPECS: dict[str, Kind] = {
    "chat": Kind(
        endpoint=Endpoint.chat_completions,
        good=lambda i: [{"role": "user", "content": f"Say the number {i}." + " Please." * 2 * i}],
        bad=[{"role": "user", "content": OVERLONG}],
        call=_chat,
        check_item=_check_chat,
        body=lambda item: {"model": MODEL, "messages": item, "max_tokens": MAX_TOKENS},
        check_body=_check_chat_body,
        sdk=lambda sdk, body: sdk.chat.completions.create(**body),
        size=lambda got: got.metric("prompt_tokens"),
        body_size=lambda body: int(body["usage"]["prompt_tokens"]),
    ),
    "completions": Kind(
        endpoint=Endpoint.completions,
        good=lambda i: f"Count from {i} to" + " ten" * 2 * i,
        bad=OVERLONG,
        call=_completions,
        check_item=_check_completion,
        body=lambda item: {"model": MODEL, "prompt": item, "max_tokens": MAX_TOKENS},
        check_body=_check_completion_body,
        sdk=lambda sdk, body: sdk.completions.create(**body),
        size=lambda got: got.metric("prompt_tokens"),
        body_size=lambda body: int(body["usage"]["prompt_tokens"]),
    ),
    "scoring": Kind(
        endpoint=Endpoint.completions,
        good=lambda i: ([1, 100 + i, 200 + i], [300 + i + j for j in range(i + 1)]),
        bad=([OVERLONG_ID] * 3000, [OVERLONG_ID]),
        call=_scoring,
        check_item=_check_score,
        body=lambda item: scoring_body(MODEL, [*item[0], *item[1]]),
        check_body=_check_score_body,
        sdk=lambda sdk, body: sdk.completions.create(**body),
        size=lambda got: got.num_tokens,
        body_size=lambda body: len(body["choices"][0]["logprobs"]["token_logprobs"]),
        also_refused=lambda client: client.batch_loglikelihood_rolling(MODEL, ["a b c"]),
    ),
    "embeddings": Kind(
        endpoint=Endpoint.embeddings,
        good=lambda i: f"text number {i}" + " more" * 2 * i,
        bad=OVERLONG,
        call=_embeddings,
        check_item=_check_embedding,
        body=lambda item: {"model": MODEL, "input": item},
        check_body=_check_embedding_body,
        sdk=lambda sdk, body: sdk.embeddings.create(**body),
        # Gemini reports no tokens per embedding: its stub's first number grows with the text
        size=lambda got: got.metric("prompt_tokens") or round(got.vector[0] * 1000),
        body_size=lambda body: (
            int(body["usage"]["prompt_tokens"]) or round(body["data"][0]["embedding"][0] * 1000)
        ),
    ),
    "responses": Kind(
        endpoint=Endpoint.responses,
        good=lambda i: f"Say the number {i}." + " Please." * 2 * i,
        bad=OVERLONG,
        call=_no_call,
        check_item=_check_chat,
        body=lambda item: {"model": MODEL, "input": item, "max_output_tokens": MAX_TOKENS},
        check_body=_check_response_body,
        sdk=lambda sdk, body: sdk.responses.create(**body),
        size=lambda got: got.metric("prompt_tokens"),
        body_size=lambda body: int(body["usage"]["input_tokens"]),
    ),
    "moderations": Kind(
        endpoint=Endpoint.moderations,
        good=lambda i: f"text number {i}" + " more" * 2 * i,
        bad=OVERLONG,
        call=_no_call,
        check_item=_check_chat,
        body=lambda item: {"model": MODEL, "input": item},
        check_body=_check_moderation_body,
        sdk=lambda sdk, body: sdk.moderations.create(**body),
        size=lambda got: None,
        # the stub scores harassment at words / 1,000: it grows with the item's text
        body_size=lambda body: round(body["results"][0]["category_scores"]["harassment"] * 1000),
    ),
}


# ------------------------------------------------------------------------------ providers

TOO_LONG = StubReply(
    status=400,
    body={
        "error": {
            "message": "This model's maximum context length is 2048 tokens.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": BAD_CODE,
        }
    },
)
"""OpenAI's answer to a prompt over the context, as the stub gives it to the overlong items."""


pytestmark = pytest.mark.stub(
    faults=[Fault(TOO_LONG, match="overlong overlong"), Fault(TOO_LONG, match=f"{OVERLONG_ID}, ")]
)


@pytest.fixture(scope="module")
async def remote_client(
    stub: StubServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RemoteBatchInference]:
    state = tmp_path_factory.mktemp("remote")
    async with RemoteBatchInference(stub.url, state_dir=state, **FAST) as client:
        yield client


@pytest.fixture(scope="module")
async def batch_api_client(
    stub: StubServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[BatchAPIBatchInference]:
    """A client of a ``batchclient serve`` app (its own provider the stub remote)."""
    provider = RemoteProvider(stub.url, max_retries=0, retry=FAST["retry"])
    app = create_app(provider, state_dir=tmp_path_factory.mktemp("served"))
    with AppServer(app) as url:
        async with BatchAPIBatchInference(
            f"{url}/v1",
            poll_interval_s=0.05,
            retry=FAST["retry"],
            state_dir=tmp_path_factory.mktemp("batch-api"),
        ) as client:
            yield client


BATCH_STUBS: dict[str, AnthropicBatchStub | GeminiBatchStub] = {}
"""The Anthropic and Gemini stubs of the module's clients: a refused cell creates no batch."""


@pytest.fixture(scope="module")
async def anthropic_client(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[AnthropicBatchInference]:
    """``AnthropicBatchInference`` over the Message Batches stub (the real ``anthropic`` SDK)."""
    with AnthropicBatchStub(process_s=0.0, error_match="overlong overlong", api_key=KEY) as stub:
        BATCH_STUBS["anthropic-batch"] = stub
        async with AnthropicBatchInference(
            stub.url,
            api_key=KEY,
            poll_interval_s=0.02,
            retry=FAST["retry"],
            state_dir=tmp_path_factory.mktemp("anthropic-batch"),
        ) as client:
            yield client


@pytest.fixture(scope="module")
async def gemini_client(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[GeminiBatchInference]:
    """``GeminiBatchInference`` over the Gemini Batch API stub (the real ``google-genai`` SDK)."""
    with GeminiBatchStub(refuse_match="overlong overlong", api_key=KEY) as stub:
        BATCH_STUBS["gemini-batch"] = stub
        async with GeminiBatchInference(
            stub.url,
            api_key=KEY,
            poll_interval_s=0.02,
            retry=FAST["retry"],
            state_dir=tmp_path_factory.mktemp("gemini-batch"),
        ) as client:
            yield client


_FIXTURE = {
    "remote": "remote_client",
    "batch-api": "batch_api_client",
    "anthropic-batch": "anthropic_client",
    "gemini-batch": "gemini_client",
    "inline": "inline_client",
    "inline-pooling": "pooling_client",
    "ray": "ray_client",
}
# the cells without an engine share one test process, which sets up the module's clients (and
# imports their SDKs) once; the engine cells go with the other server and engine tests
_QUICK = [pytest.mark.xdist_group("capabilities")]
_SDK = [*_QUICK, pytest.mark.slow]  # the SDK's import alone takes seconds
_MARKS: dict[str, list[pytest.MarkDecorator]] = {
    "remote": _QUICK,
    "batch-api": _QUICK,
    "anthropic-batch": _SDK,
    "gemini-batch": _SDK,
    "inline": [pytest.mark.engine],
    "inline-pooling": [pytest.mark.engine],
    # the cluster and its engine take one to several minutes to start on 2 busy cores
    "ray": [pytest.mark.engine, pytest.mark.timeout(1500)],
}


def _cells() -> list[Any]:
    cells = []
    for cell in CELLS:
        marks = list(_MARKS[cell[0]])
        if cell[0] == "batch-api" and cell[1] in NO_CALL:
            marks.append(pytest.mark.slow)  # the remote cells show the same in the quick tier
        if cell in KNOWN_DEFECTS:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_DEFECTS[cell]))
        cells.append(pytest.param(cell, marks=marks, id="-".join(cell)))
    return cells


# ------------------------------------------------------------------------------ the faces


def rows(data: bytes | str) -> list[dict[str, Any]]:
    text = data.decode() if isinstance(data, bytes) else data
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def line_code(row: dict[str, Any]) -> str | None:
    """The error code of an error-file line: its own ``error`` (no HTTP answer), else the
    refusal body's."""
    if row.get("error"):
        return cast(str, row["error"]["code"])
    return cast(str | None, row["response"]["body"]["error"]["code"])


def input_file(kind: Kind, ids: list[str]) -> bytes:
    lines = [
        json.dumps(
            {"custom_id": cid, "method": "POST", "url": kind.endpoint.value, "body": kind.body(x)}
        )
        for cid, x in zip(ids, kind.items(), strict=True)
    ]
    return jsonl(lines)


def assert_grows(sizes: list[Any]) -> None:
    """Attribution: item i's prompt is longer than item i-1's, so each answer's own prompt
    size (usage, or scored tokens) must grow along the results; a swapped answer breaks it."""
    assert all(isinstance(n, int | float) for n in sizes), sizes
    assert sizes == sorted(set(sizes)), sizes


def check_files(
    kind: Kind, ids: list[str], out: list[dict[str, Any]], err: list[dict[str, Any]], bad_code: str
) -> None:
    """The output file holds the good lines in input order with OpenAI answers, the error
    file the bad one with its code."""
    good = [cid for i, cid in enumerate(ids) if i != BAD]
    assert [r["custom_id"] for r in out] == good
    items = [x for i, x in enumerate(kind.items()) if i != BAD]
    for row, item in zip(out, items, strict=True):
        assert row["error"] is None and row["response"]["status_code"] == 200
        kind.check_body(item, row["response"]["body"])
    assert_grows([kind.body_size(row["response"]["body"]) for row in out])
    assert [r["custom_id"] for r in err] == [ids[BAD]]
    assert line_code(err[0]) == bad_code, err[0]


async def face_call(
    client: BatchClient, kind: Kind, ids: list[str], expected: str, bad_code: str
) -> None:
    if expected != OK:
        with pytest.raises(ConfigurationError, match=re.escape(kind.endpoint.value)):
            await kind.call(client, kind.items(), ids)
        if kind.also_refused is not None:
            with pytest.raises(ConfigurationError, match=re.escape(kind.endpoint.value)):
                await kind.also_refused(client)
        return
    got = await kind.call(client, kind.items(), ids)
    assert [r.custom_id for r in got] == ids
    for i, (item, response) in enumerate(zip(kind.items(), got, strict=True)):
        if i == BAD:
            assert response.error is not None and response.error.code == bad_code, response.error
        else:
            assert response.error is None, (i, response.error)
            kind.check_item(item, response)
    assert_grows([kind.size(r) for i, r in enumerate(got) if i != BAD])


async def face_job(
    client: BatchClient, kind: Kind, ids: list[str], expected: str, bad_code: str
) -> None:
    record = await client.files.create(input_file(kind, ids), filename="in.jsonl")
    if expected != OK:
        with pytest.raises(ConfigurationError, match=re.escape(kind.endpoint.value)):
            await client.batches.create(record.id, endpoint=kind.endpoint.value)
        return
    batch = await client.batches.create(record.id, endpoint=kind.endpoint.value)
    with anyio.fail_after(WAIT_S):
        batch = await client.batches.wait(batch.id)
    assert batch.status == "completed" and batch.request_counts.total == N
    assert batch.output_file_id is not None and batch.error_file_id is not None
    out = rows(await client.files.content(batch.output_file_id))
    err = rows(await client.files.content(batch.error_file_id))
    check_files(kind, ids, out, err, bad_code)
    result = await client.job_result(batch.id)
    assert [r.custom_id for r in result.batch] == ids
    codes = [r.error.code if r.error is not None else None for r in result.batch]
    assert codes == [bad_code if i == BAD else None for i in range(N)]


async def face_server(
    client: BatchClient, kind: Kind, ids: list[str], expected: str, bad_code: str
) -> None:
    async with AppServer(create_app(client)) as url:
        sdk = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        try:
            await _server(sdk, kind, ids, expected, bad_code)
        finally:
            await sdk.close()


async def _server(
    sdk: openai.AsyncOpenAI, kind: Kind, ids: list[str], expected: str, bad_code: str
) -> None:
    upload = await sdk.files.create(file=("in.jsonl", input_file(kind, ids)), purpose="batch")
    endpoint: Any = kind.endpoint.value
    items = kind.items()
    if expected != OK:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.batches.create(
                input_file_id=upload.id, endpoint=endpoint, completion_window="24h"
            )
        assert refused.value.param == "endpoint" and refused.value.code is None
        assert kind.endpoint.value in refused.value.message
        with pytest.raises(openai.NotFoundError) as missing:
            await kind.sdk(sdk, kind.body(items[0]))
        assert missing.value.code is None and kind.endpoint.value in missing.value.message
        return
    batch = await sdk.batches.create(
        input_file_id=upload.id, endpoint=endpoint, completion_window="24h"
    )
    with anyio.fail_after(WAIT_S):
        while batch.status not in ("completed", "failed", "cancelled", "expired"):
            await anyio.sleep(0.05)
            batch = await sdk.batches.retrieve(batch.id)
    assert batch.status == "completed", batch.errors
    assert batch.output_file_id is not None and batch.error_file_id is not None
    out = rows((await sdk.files.content(batch.output_file_id)).text)
    err = rows((await sdk.files.content(batch.error_file_id)).text)
    check_files(kind, ids, out, err, bad_code)
    # one request at a time: the answer as OpenAI's, the bad one in OpenAI's envelope
    sizes = []
    for i, item in enumerate(items):
        if i == BAD:
            with pytest.raises(openai.BadRequestError) as bad:
                await kind.sdk(sdk, kind.body(item))
            assert bad.value.code == bad_code, bad.value.body
        else:
            answer = (await kind.sdk(sdk, kind.body(item))).model_dump()
            kind.check_body(item, answer)
            sizes.append(kind.body_size(answer))
    assert_grows(sizes)


FACE_RUN = {"call": face_call, "job": face_job, "server": face_server}


# ------------------------------------------------------------------------------ the test


@pytest.fixture
def cell(request: pytest.FixtureRequest) -> tuple[str, str, str]:
    return cast(tuple[str, str, str], request.param)


@pytest.fixture
def client(cell: tuple[str, str, str], request: pytest.FixtureRequest) -> BatchClient:
    """The cell's provider: its (module or session) fixture, set up outside the test's loop."""
    return cast(BatchClient, request.getfixturevalue(_FIXTURE[cell[0]]))


@pytest.mark.parametrize("cell", _cells(), indirect=True)
async def test_capability(
    cell: tuple[str, str, str],
    client: BatchClient,
    record_property: Callable[[str, object], None],
) -> None:
    provider, kind, face = cell
    expected = CAPABILITIES[cell]
    record_property(CELL, (provider, kind, face, "✓" if expected == OK else expected))
    ids = [f"{kind}-{i}" for i in range(N)]
    bad_code = BAD_CODES.get(provider, BAD_CODE)
    stub = BATCH_STUBS.get(provider)
    before = len(stub.batches) if stub is not None else 0
    await FACE_RUN[face](client, SPECS[kind], ids, expected, bad_code)
    if stub is not None and expected != OK:
        assert len(stub.batches) == before  # refused before anything was sent


def test_the_table_covers_every_cell() -> None:
    assert set(CAPABILITIES) == set(CELLS)
    assert len(CELLS) == len(PROVIDERS) * (len(KINDS) * len(FACES) - len(NO_CALL))
    assert set(KNOWN_DEFECTS) <= set(CAPABILITIES)
    assert Path(__file__).name == "test_capabilities.py"  # capability_matrix imports it by name
