"""Completions and embeddings requests on the engine (chat lives in :mod:`._client`).

- ``/v1/completions``: the prompt is tokenised with the engine's tokenizer (special tokens as
  the body's ``add_special_tokens``, default on, as vLLM's server), checked against the
  context, and generated with ``prompt_logprobs`` when the body asks for the prompt's
  log-probabilities (scoring requests do: :func:`batchclient._core.scoring
  .prompt_logprobs_body`).
- Scoring one-token continuations (:func:`score_next_tokens`): one generation request over the
  context alone, ``max_tokens`` 1 at temperature 0 with ``logprob_token_ids`` = the
  continuations' tokens (every choice of a question in one pass: :mod:`._next_tokens` merges
  them), which reads vLLM's prefix cache (a request with ``prompt_logprobs`` never does); each
  answer has the shape of the ``prompt_logprobs`` path's.
- Scoring continuations of several tokens (:func:`score_forced`): one generation request over
  the context that is made to generate the continuation's tokens (teacher forcing,
  :mod:`._forced`), also reading the prefix cache; the same shape of answer.
- ``/v1/embeddings``: on a pooling engine (``runner="pooling", convert="embed"``), one
  ``AsyncLLM.encode`` per input with ``PoolingParams(task="embed")``, which normalises as
  vLLM's server does.

Imported only when an engine starts (it imports vLLM).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
from vllm.pooling_params import PoolingParams

from .._core.request import Result, failed
from ..errors import ErrorCode
from . import _engine
from ._completions import (
    CompletionPlan,
    check_prompt_length,
    completion_object,
    embedding_object,
    encode_vector,
    forced_prompt_logprobs,
    legacy_logprobs,
    map_completion_body,
    map_embedding_body,
    next_token_prompt_logprobs,
    prompt_logprobs_json,
)
from ._forced import FORCED_TOKENS
from ._logprob_gate import side_of
from ._mapping import Refusal
from ._next_tokens import copy_result

if TYPE_CHECKING:
    from ._engine import Engine


def _refused(refusal: Refusal) -> Result:
    return failed(refusal.code, refusal.message, status_code=400, param=refusal.param)


def _error(exc: Exception) -> Result:
    message = str(exc) or type(exc).__name__
    if _engine.is_context_error(exc):
        return failed(ErrorCode.context_length_exceeded, message, status_code=400, param="prompt")
    if _engine.is_request_error(exc):
        return failed(ErrorCode.invalid_request, message, status_code=400)
    return failed(ErrorCode.engine_error, f"{type(exc).__name__}: {message}")


async def _final(outputs: AsyncIterator[Any], llm: Any, request_id: str) -> Any:
    """The last output of an engine request; aborts it in the engine when cancelled (vLLM's own
    abort can be cut short by an anyio cancel scope; aborting twice is harmless)."""
    final = None
    try:
        async for output in outputs:
            final = output
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await llm.abort(request_id)
        raise
    return final


async def _generate(
    engine: Engine, ids: list[int], params: Any, request_id: str, limiter: Any
) -> Any:
    """The final output of one generation request over token ids, sent under ``limiter`` and
    the engine's log-probability gate (:mod:`._logprob_gate`); raises what the engine
    raises."""
    llm = engine.llm
    async with limiter, engine.gate.enter(side_of(params)):
        return await _final(
            llm.generate({"prompt_token_ids": ids}, params, request_id), llm, request_id
        )


def _tokens(tokenizer: Any, prompt: str | list[int], add_special_tokens: bool) -> list[int]:
    if isinstance(prompt, list):
        return prompt
    return list(tokenizer(prompt, add_special_tokens=add_special_tokens).input_ids)


async def complete(
    engine: Engine,
    body: dict[str, Any],
    model: str,
    request_id: str,
    limiter: Any,
    *,
    scoring: bool = False,
) -> Result:
    """Run one ``/v1/completions`` body; the result's body is a ``Completion`` object.

    ``scoring``: a scoring request of the client's own (nobody reads its text), so nothing is
    detokenised and ``prompt_logprobs`` carry no ``decoded_token``: the text of every prompt
    position is most of the front end's work otherwise (lm-evaluation-harness's ``vllm``
    backend skips it the same way, ``detokenize=False``)."""
    llm = engine.llm
    try:
        plan = map_completion_body(body, engine.sampling_defaults)
        if scoring:
            plan.sampling["detokenize"] = False
        tokenizer = llm.get_tokenizer()
        ids = _tokens(tokenizer, plan.prompt, plan.add_special_tokens)
        if not ids:
            raise Refusal(ErrorCode.invalid_request, "the prompt is empty", "prompt")
        check_prompt_length(len(ids), plan.max_tokens, engine.max_model_len)
        params = _engine.sampling_params(plan.sampling, plan.max_tokens, plan.structured)
    except Refusal as refusal:
        return _refused(refusal)
    except Exception as exc:  # vLLM's validation of the sampling fields
        return _error(exc)
    started, started_wall = time.perf_counter(), time.time()
    try:
        final = await _generate(engine, ids, params, request_id, limiter)
    except Exception as exc:
        return _error(exc)
    if final is None or not final.outputs:
        return failed(ErrorCode.engine_error, "the engine finished without an output")
    body_out = _completion_body(
        plan, ids, final, request_id, model, started_wall, None if scoring else tokenizer
    )
    return Result(
        status_code=200,
        body=body_out,
        request_id=request_id,
        latency_s=time.perf_counter() - started,
    )


async def score_next_tokens(
    engine: Engine,
    context: list[int],
    tokens: list[int],
    model: str,
    request_id: str,
    limiter: Any,
) -> list[Result]:
    """Score each of ``tokens`` (distinct ids, at most
    :data:`._next_tokens.MAX_NEXT_TOKENS`) as the one-token continuation of ``context``, from
    the position after it: one generation request over the context alone with ``max_tokens``
    1, greedy, and vLLM's ``logprob_token_ids=tokens`` (raw log-probabilities, as
    ``prompt_logprobs``; no ``logprobs`` beside it: vLLM refuses a count that differs from the
    ids'). Without ``prompt_logprobs`` the request reads the prefix cache, so a context shared
    with earlier requests (few-shot examples) is not computed again.

    Returns one result per token, in order: a ``Completion`` whose ``prompt_logprobs`` hold the
    continuation's position only (:func:`._completions.next_token_prompt_logprobs`), which is
    what :func:`batchclient._core.scoring.to_loglikelihood` reads, as a scoring request of
    ``context + [token]`` would get it. A refusal or failure is every token's."""
    llm = engine.llm
    vocab = _vocab_size(llm)
    if vocab is not None and any(not 0 <= t < vocab for t in tokens):
        # vLLM refuses the whole request for one such id: the others are scored without it
        inside = [t for t in tokens if 0 <= t < vocab]
        by_token: dict[int, Result] = {}
        if inside:
            scored = await score_next_tokens(engine, context, inside, model, request_id, limiter)
            by_token = dict(zip(inside, scored, strict=True))
        return [
            by_token.get(t)
            or failed(
                ErrorCode.invalid_request,
                f"token id {t} is outside the model's vocabulary ({vocab} tokens)",
                status_code=400,
                param="prompt",
            )
            for t in tokens
        ]

    def every(result: Result) -> list[Result]:
        return [result] + [copy_result(result) for _ in tokens[1:]]

    try:
        check_prompt_length(len(context), 1, engine.max_model_len)
        # no sampling defaults of the model (penalties would move the greedy token away from
        # the raw logits' best, which is what is_greedy means)
        sampling = {"temperature": 0.0, "logprob_token_ids": list(tokens), "detokenize": False}
        params = _engine.sampling_params(sampling, 1, None)
    except Refusal as refusal:
        return every(_refused(refusal))
    except Exception as exc:
        return every(_error(exc))
    started, started_wall = time.perf_counter(), time.time()
    try:
        final = await _generate(engine, context, params, request_id, limiter)
    except Exception as exc:
        return every(_error(exc))
    try:
        output = final.outputs[0]
        greedy = int(output.token_ids[0])
        step = output.logprobs[0]
        greedy_logprob = float(step[greedy].logprob)
        logprobs = [float(step[token].logprob) for token in tokens]
    except (AttributeError, IndexError, KeyError, TypeError) as exc:
        return every(
            failed(
                ErrorCode.engine_error,
                f"the engine's answer has no log-probability for the continuation token ({exc!r})",
            )
        )
    latency = time.perf_counter() - started
    # as vLLM's server reports them: how much of the context came from the prefix cache (the
    # first token's; the others share its one pass over the context)
    cached = int(getattr(final, "num_cached_tokens", 0) or 0)
    results = []
    for i, (token, logprob) in enumerate(zip(tokens, logprobs, strict=True)):
        body_out = completion_object(
            request_id=request_id,
            model=model,
            created=int(started_wall),
            text="",
            finish_reason=output.finish_reason,
            prompt_tokens=len(context),
            completion_tokens=1,
            logprobs=None,
            prompt_logprobs=next_token_prompt_logprobs(
                len(context), token, logprob, greedy, greedy_logprob
            ),
        )
        body_out["usage"]["prompt_tokens_details"] = {
            "cached_tokens": cached if i == 0 else len(context)
        }
        results.append(
            Result(status_code=200, body=body_out, request_id=request_id, latency_s=latency)
        )
    return results


async def score_forced(
    engine: Engine,
    context: list[int],
    continuation: list[int],
    model: str,
    request_id: str,
    limiter: Any,
) -> Result:
    """Score ``continuation`` (two tokens or more) after ``context`` by teacher forcing: one
    generation request over the context alone that generates exactly the continuation's tokens
    (:class:`._forced.ForcedTokens`), greedy with ``logprobs=0``, so each step reports the
    continuation token's raw log-probability and its rank (1: greedy). Not ``logprobs=1``:
    in an engine step that also runs a request with ``logprob_token_ids`` (a one-token
    scoring request), vLLM 0.32 answers every request of the step in that request's terms,
    and a top-1 token would then be padding (token 0 at -inf); the sampled token's rank is
    right either way. Without
    ``prompt_logprobs`` the request reads the prefix cache: a context shared with earlier
    requests is not computed again, and only the last position's logits are, not every
    prompt position's.

    Returns what a ``prompt_logprobs`` scoring request of ``context + continuation`` would
    (:func:`._completions.forced_prompt_logprobs`), which
    :func:`batchclient._core.scoring.to_loglikelihood` reads. A token id outside the
    vocabulary is ``invalid_request``; an engine that did not generate the forced tokens is
    ``engine_error``, never a wrong score."""
    llm = engine.llm
    vocab = _vocab_size(llm)
    if vocab is not None and any(not 0 <= t < vocab for t in continuation):
        bad = next(t for t in continuation if not 0 <= t < vocab)
        return failed(
            ErrorCode.invalid_request,
            f"token id {bad} is outside the model's vocabulary ({vocab} tokens)",
            status_code=400,
            param="prompt",
        )
    k = len(continuation)
    try:
        check_prompt_length(len(context), k, engine.max_model_len)
        # no sampling defaults of the model (penalties or stop tokens would change the steps)
        sampling = {
            "temperature": 0.0,
            "logprobs": 0,
            "ignore_eos": True,
            "detokenize": False,
            "extra_args": {FORCED_TOKENS: list(continuation)},
        }
        params = _engine.sampling_params(sampling, k, None)
    except Refusal as refusal:
        return _refused(refusal)
    except Exception as exc:
        return _error(exc)
    started, started_wall = time.perf_counter(), time.time()
    try:
        final = await _generate(engine, context, params, request_id, limiter)
    except Exception as exc:
        return _error(exc)
    try:
        output = final.outputs[0]
        generated = [int(t) for t in output.token_ids]
        if generated != continuation:
            raise ValueError(f"generated {generated}, not the forced {continuation}")
        steps = [
            (token, float(step[token].logprob), int(step[token].rank))
            for token, step in zip(continuation, output.logprobs, strict=True)
        ]
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        return failed(
            ErrorCode.engine_error,
            f"the engine's answer does not score the continuation ({exc})",
        )
    body_out = completion_object(
        request_id=request_id,
        model=model,
        created=int(started_wall),
        text="",
        finish_reason=output.finish_reason,
        prompt_tokens=len(context) + k,
        completion_tokens=1,
        logprobs=None,
        prompt_logprobs=forced_prompt_logprobs(len(context), steps),
    )
    cached = int(getattr(final, "num_cached_tokens", 0) or 0)
    body_out["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
    return Result(
        status_code=200,
        body=body_out,
        request_id=request_id,
        latency_s=time.perf_counter() - started,
    )


def _vocab_size(llm: Any) -> int | None:
    """The model's vocabulary size as vLLM checks token ids against it, or None if unknown."""
    try:
        return int(llm.model_config.get_vocab_size())
    except Exception:  # another engine build: vLLM's own check still applies
        return None


def _completion_body(
    plan: CompletionPlan,
    ids: list[int],
    final: Any,
    request_id: str,
    model: str,
    started_wall: float,
    tokenizer: Any,
) -> dict[str, Any]:
    """The ``Completion`` object; without a ``tokenizer`` (scoring) tokens have no text."""

    def decode(token_id: int) -> str:
        return "" if tokenizer is None else str(tokenizer.decode([token_id]))

    output = final.outputs[0]
    prompt_steps = list(final.prompt_logprobs or [])
    out_ids = [] if plan.drop_output else list(output.token_ids)
    out_text = "" if plan.drop_output else output.text
    text, logprobs = out_text, None
    if plan.echo:
        prompt_text = plan.prompt if isinstance(plan.prompt, str) else str(tokenizer.decode(ids))
        text = prompt_text + out_text
    if plan.logprobs is not None:
        out_steps = [] if plan.drop_output else list(output.logprobs or [])
        if plan.echo:
            steps = prompt_steps + out_steps
            logprobs = legacy_logprobs([*ids, *out_ids], steps, plan.logprobs, decode)
        else:
            logprobs = legacy_logprobs(out_ids, out_steps, plan.logprobs, decode)
    return completion_object(
        request_id=request_id,
        model=model,
        created=int(started_wall),
        text=text,
        finish_reason=output.finish_reason,
        prompt_tokens=len(ids),
        completion_tokens=len(output.token_ids),
        logprobs=logprobs,
        prompt_logprobs=(
            prompt_logprobs_json(prompt_steps, decode if tokenizer is not None else None)
            # as vLLM's server: present whenever the engine computed them, so also for
            # echoed log-probabilities
            if "prompt_logprobs" in plan.sampling
            else None
        ),
    )


async def embed(
    engine: Engine, body: dict[str, Any], model: str, request_id: str, limiter: Any
) -> Result:
    """Run one ``/v1/embeddings`` body (every input of it); the result's body is a
    ``CreateEmbeddingResponse``."""
    llm = engine.llm
    try:
        plan = map_embedding_body(body)
        tokenizer = llm.get_tokenizer()
        prompts = [_tokens(tokenizer, p, plan.add_special_tokens) for p in plan.inputs]
        for ids in prompts:
            check_prompt_length(len(ids), 0, engine.max_model_len)
        params = PoolingParams(task="embed", dimensions=plan.dimensions)
    except Refusal as refusal:
        return _refused(refusal)
    except Exception as exc:
        return _error(exc)
    started, started_wall = time.perf_counter(), time.time()
    vectors: list[list[float] | str] = [[] for _ in prompts]
    failure: list[Result] = []

    async def one(i: int, ids: list[int]) -> None:
        rid = f"{request_id}-{i}"
        try:
            final = await _final(llm.encode({"prompt_token_ids": ids}, params, rid), llm, rid)
        except Exception as exc:
            failure.append(_error(exc))
            return
        if final is None:
            failure.append(failed(ErrorCode.engine_error, "the engine finished without output"))
            return
        vectors[i] = encode_vector(final.outputs.data.tolist(), plan.encoding_format)

    async with limiter, anyio.create_task_group() as tg:
        for i, ids in enumerate(prompts):
            tg.start_soon(one, i, ids)
    if failure:
        return failure[0]
    body_out = embedding_object(
        request_id=request_id,
        model=model,
        created=int(started_wall),
        vectors=vectors,
        tokens=sum(len(p) for p in prompts),
    )
    return Result(
        status_code=200,
        body=body_out,
        request_id=request_id,
        latency_s=time.perf_counter() - started,
    )
