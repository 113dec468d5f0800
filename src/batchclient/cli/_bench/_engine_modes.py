"""Modes that run vLLM engines: ``inline`` (:class:`~batchclient.VLLMBatchInference`),
``vllm-offline`` (raw ``vllm.LLM.chat``, the ceiling reference), ``vllm-defaults`` (the same
with vLLM's own thread binding) and ``ray`` (:class:`~batchclient.RayBatchInference` with
``spec.replicas`` engines on a local Ray).

Every engine gets the same arguments (:func:`engine_args`, and the dtype
``batchclient._engine_defaults`` chooses for this hardware): the model, its context length, eager
mode, a ``spec.kv_cache_gib`` KV cache (split between Ray replicas, so the total is the same)
and vLLM's offline scheduler limits, the ones the harness's server gets too. The thread binding
comes from the child's environment (the harness sets it; see ``_run.harness_binding``). Each
warms up with the same prompts as the server modes outside the clock, then generates every
request greedily to exactly its ``max_tokens`` (``ignore_eos``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..._engine_defaults import decide
from ._client_modes import WARMUP, WARMUP_MAX_TOKENS, timed_batch
from ._spec import (
    ENGINE_MAX_NUM_BATCHED_TOKENS,
    ENGINE_MAX_NUM_SEQS,
    BenchRequest,
    RequestFigures,
    RunSpec,
)


def engine_args(spec: RunSpec) -> dict[str, Any]:
    """vLLM engine arguments shared by ``inline`` and ``vllm-offline``."""
    return {
        "served_model_name": spec.model_name,
        "max_model_len": spec.max_model_len,
        "enforce_eager": True,
        "kv_cache_memory_bytes": spec.kv_cache_gib << 30,
        "max_num_seqs": ENGINE_MAX_NUM_SEQS,
        "max_num_batched_tokens": ENGINE_MAX_NUM_BATCHED_TOKENS,
    }


async def run_inline(
    spec: RunSpec, requests: Sequence[BenchRequest], client: Any = None
) -> tuple[list[RequestFigures], float]:
    """``inline``: one ``VLLMBatchInference.batch_chat_completion`` call over every request.
    ``client``: an already open ``VLLMBatchInference`` to use instead of starting one (tests
    reuse their session engine this way)."""
    from ..._registry import make_client

    if client is not None:
        return await timed_batch(client, spec, requests)
    async with make_client("vllm", model=spec.model_path, **engine_args(spec)) as own:
        return await timed_batch(own, spec, requests)


async def run_ray(
    spec: RunSpec, requests: Sequence[BenchRequest]
) -> tuple[list[RequestFigures], float]:
    """``ray``: one ``RayBatchInference.batch_chat_completion`` call over every request, with
    ``spec.replicas`` replicas on a local Ray started for the run (each replica bound to its own
    share of the cores by the provider's default, and given its share of the KV cache)."""
    from ..._registry import make_client

    args = engine_args(spec)
    args["kv_cache_memory_bytes"] = args["kv_cache_memory_bytes"] // spec.replicas
    async with make_client("ray", model=spec.model_path, replicas=spec.replicas, **args) as client:
        return await timed_batch(client, spec, requests)


def run_vllm_offline(
    spec: RunSpec, requests: Sequence[BenchRequest]
) -> tuple[list[RequestFigures], float]:
    """``vllm-offline`` and ``vllm-defaults``: ``vllm.LLM.chat(conversations, sampling_params)``
    with one ``SamplingParams(max_tokens=..., temperature=0, ignore_eos=True)`` per
    conversation. The offline API gives no per-request timings (without vLLM's stat loggers),
    so no latency or time to first token."""
    from vllm import LLM
    from vllm import SamplingParams as VllmSamplingParams

    args = engine_args(spec)
    # the dtype every engine batchclient starts gets (by the CPU), so the ceiling is comparable
    llm = LLM(model=spec.model_path, **decide(args).apply(args))
    if spec.warmup:
        llm.chat(
            WARMUP,  # type: ignore[arg-type]
            VllmSamplingParams(max_tokens=WARMUP_MAX_TOKENS, temperature=0),
            use_tqdm=False,
        )
    params = [
        VllmSamplingParams(max_tokens=r.max_tokens, temperature=0, ignore_eos=True)
        for r in requests
    ]
    started = time.perf_counter()
    outputs = llm.chat([r.messages for r in requests], params, use_tqdm=False)  # type: ignore[arg-type]
    wall = time.perf_counter() - started
    return [_output_figures(o) for o in outputs], wall


def _output_figures(output: Any) -> RequestFigures:
    completion = output.outputs[0] if output.outputs else None
    if completion is None:
        return RequestFigures(error="no output")
    return RequestFigures(
        prompt_tokens=len(output.prompt_token_ids or ()),
        output_tokens=len(completion.token_ids),
    )
