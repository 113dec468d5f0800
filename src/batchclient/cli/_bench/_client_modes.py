"""Modes that send the requests to an OpenAI-compatible server: ``sequential`` and ``remote``
(batchclient's :class:`~batchclient.RemoteBatchInference`), and the peer clients
``openai-gather`` (``AsyncOpenAI`` + a semaphore) and ``litellm`` (``litellm.completion`` on a
thread pool, as ``litellm.batch_completion`` runs it).

Each takes the run's spec and requests and returns one :class:`RequestFigures` per request and
the wall time of the timed part. Every mode first warms its own client up (connections, the
server's first large prefill) with :data:`WARMUP` outside the clock. Every request asks for
greedy sampling, its own ``max_tokens`` and ``ignore_eos``, so every mode generates exactly the
same number of tokens. Latency is measured from when a request is sent (after any wait for a
free slot) to its full answer; none of these modes streams, so none exposes time to first token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._spec import BenchRequest, RequestFigures, RunSpec

WARMUP: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": f"Warm up {i}." + " word" * (300 * i)}] for i in range(4)
]
"""Short and long prompts, not among the measured ones: the first large prefill on a CPU pays
one-off kernel set-up that would otherwise land in whichever mode runs first."""
WARMUP_MAX_TOKENS = 4


# ------------------------------------------------------------------------------ batchclient


async def run_remote(
    spec: RunSpec, requests: Sequence[BenchRequest]
) -> tuple[list[RequestFigures], float]:
    """``sequential`` (``spec.concurrency`` 1) and ``remote``: one
    ``RemoteBatchInference.batch_chat_completion`` call with a fixed in-flight limit
    (``adaptive=False``: the limit is the one asked for)."""
    from ..._registry import make_client

    async with make_client(
        "remote", base_url=spec.base_url, max_concurrency=spec.concurrency, adaptive=False
    ) as client:
        return await timed_batch(client, spec, requests)


async def timed_batch(
    client: Any, spec: RunSpec, requests: Sequence[BenchRequest]
) -> tuple[list[RequestFigures], float]:
    """Warm ``client`` up (when asked), then time one ``batch_chat_completion`` over every
    request (greedy, ``ignore_eos``); any batchclient provider."""
    from ...types import SamplingParams

    if spec.warmup:
        await client.batch_chat_completion(
            spec.model_name, WARMUP, SamplingParams(max_tokens=WARMUP_MAX_TOKENS)
        )
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True) for r in requests]
    started = time.perf_counter()
    result = await client.batch_chat_completion(
        spec.model_name,
        [r.messages for r in requests],
        params,
        custom_ids=[r.custom_id for r in requests],
    )
    wall = time.perf_counter() - started
    return [response_figures(item) for item in result.batch], wall


def response_figures(item: Any) -> RequestFigures:
    """A batchclient ``ChatCompletionResponse`` -> :class:`RequestFigures` (its ``usage``
    metrics, ``latency`` and ``time_to_first_token`` where the provider measured them)."""
    if item.error is not None:
        return RequestFigures(error=f"{item.error.code}: {item.error.message}")
    return RequestFigures(
        prompt_tokens=int(item.metric("prompt_tokens") or 0),
        output_tokens=int(item.metric("completion_tokens") or 0),
        latency_s=item.metric("latency"),
        ttft_s=item.metric("time_to_first_token"),
    )


# ------------------------------------------------------------------------------ peers


async def run_openai_gather(
    spec: RunSpec, requests: Sequence[BenchRequest]
) -> tuple[list[RequestFigures], float]:
    """``openai-gather``: the usual hand-written fan-out, ``asyncio.gather`` over
    ``AsyncOpenAI.chat.completions.create`` calls with an ``asyncio.Semaphore`` of
    ``spec.concurrency``, on the SDK's default (httpx) HTTP client and retry settings."""
    from openai import AsyncOpenAI

    gate = asyncio.Semaphore(spec.concurrency)
    async with AsyncOpenAI(base_url=spec.base_url, api_key="EMPTY", timeout=600.0) as client:

        async def one(messages: Any, max_tokens: int, extra: dict[str, Any]) -> RequestFigures:
            async with gate:
                sent = time.perf_counter()
                try:
                    answer = await client.chat.completions.create(
                        model=spec.model_name,
                        messages=messages,
                        max_tokens=max_tokens,
                        temperature=0.0,
                        extra_body=extra,
                    )
                except Exception as exc:  # a peer's failure is a figure, not a crash
                    return RequestFigures(error=f"{type(exc).__name__}: {exc}")
                return _usage_figures(answer.usage, time.perf_counter() - sent)

        if spec.warmup:
            await asyncio.gather(*(one(m, WARMUP_MAX_TOKENS, {}) for m in WARMUP))
        started = time.perf_counter()
        items = await asyncio.gather(
            *(one(r.messages, r.max_tokens, {"ignore_eos": True}) for r in requests)
        )
        wall = time.perf_counter() - started
    return list(items), wall


def run_litellm(
    spec: RunSpec, requests: Sequence[BenchRequest]
) -> tuple[list[RequestFigures], float]:
    """``litellm``: ``litellm.completion`` calls on a ``ThreadPoolExecutor`` of
    ``spec.concurrency`` workers, exactly as ``litellm.batch_completion`` runs a batch, with
    ``model="hosted_vllm/<name>"``. ``batch_completion`` itself takes one ``max_tokens`` for
    the whole batch, so it cannot ask each request for its reference length; the same pool
    over ``completion`` can."""
    import litellm

    litellm.suppress_debug_info = True

    def one(messages: Any, max_tokens: int, ignore_eos: bool) -> RequestFigures:
        sent = time.perf_counter()
        try:
            answer: Any = litellm.completion(
                model=f"hosted_vllm/{spec.model_name}",
                api_base=spec.base_url,
                api_key="EMPTY",
                messages=messages,
                max_tokens=max_tokens,
                temperature=0.0,
                ignore_eos=ignore_eos,
                timeout=600,
            )
        except Exception as exc:  # a peer's failure is a figure, not a crash
            return RequestFigures(error=f"{type(exc).__name__}: {exc}")
        return _usage_figures(answer.usage, time.perf_counter() - sent)

    with ThreadPoolExecutor(max_workers=spec.concurrency) as pool:
        if spec.warmup:
            list(pool.map(lambda m: one(m, WARMUP_MAX_TOKENS, False), WARMUP))
        started = time.perf_counter()
        futures = [pool.submit(one, r.messages, r.max_tokens, True) for r in requests]
        items = [f.result() for f in futures]
        wall = time.perf_counter() - started
    return items, wall


def _usage_figures(usage: Any, latency_s: float) -> RequestFigures:
    if usage is None:
        return RequestFigures(error="answer without usage")
    return RequestFigures(
        prompt_tokens=int(usage.prompt_tokens or 0),
        output_tokens=int(usage.completion_tokens or 0),
        latency_s=latency_s,
    )
