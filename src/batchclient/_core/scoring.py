"""Log-likelihood scoring: (context, continuation) pairs -> scoring requests -> scores.

The rules are lm-evaluation-harness's (v0.4.13, ``lm_eval/api/model.py`` ``TemplateLM`` and
``lm_eval/models/vllm_causallms.py``), so a score here equals the one its own backends give:

- **Tokenising a pair**: whitespace at the end of the context moves to the start of the
  continuation; ``context + continuation`` and ``context`` are encoded (the tokenizer's special
  tokens included, but not again for text that already starts with the BOS token); the
  continuation's tokens are the whole's tokens after the context's. The prompt sent is the
  context's tokens followed by those. An empty context stands for the prefix token (BOS, else
  EOS), and the continuation is then encoded without special tokens.
- **Scoring**: one ``/v1/completions`` request per pair over the token ids, asking for the
  prompt's log-probabilities (``echo`` + ``logprobs: 1`` + ``max_tokens: 1``, the body
  lm-evaluation-harness's ``local-completions`` sends; vLLM's ``prompt_logprobs`` where the
  endpoint is vLLM). ``logprob`` is the sum over the continuation's positions; ``is_greedy``
  holds when each continuation token's log-probability is the highest at its position.
- **Rolling** (perplexity): the text's tokens are cut into disjoint windows of at most
  ``max_model_len - 2`` predicted tokens, each conditioned on the tokens before it, the first
  on the prefix token (``get_rolling_token_windows`` + ``make_disjoint_window``, with the
  window of lm-evaluation-harness's ``vllm`` backend); the text's score is the windows' sum.

Unlike lm-evaluation-harness, a prompt over the model's context is refused
(``context_length_exceeded``) rather than cut from the left: a silently shortened context
changes the score.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..errors import ConfigurationError, ErrorCode
from ..types import BatchItemError, Endpoint, LoglikelihoodResponse, ScoringRequest
from .calls import check_custom_ids, lazy_requests
from .decode import clamp_logprob
from .request import Request, Result, item_error
from .tokens import Tokenizer, TokenizerInfo

__all__ = [
    "combine_windows",
    "encode_pairs",
    "loglikelihood_requests",
    "prompt_logprobs_body",
    "rolling_requests",
    "rolling_windows",
    "scoring_body",
    "split_pair",
    "to_loglikelihood",
]

TokenPair = tuple[list[int], list[int]]


def split_pair(context: str, continuation: str) -> tuple[str, str]:
    """Move whitespace at the end of ``context`` to the start of ``continuation``."""
    stripped = context.rstrip()
    return stripped, context[len(stripped) :] + continuation


def _bad(message: str, param: str = "continuation") -> BatchItemError:
    return item_error(ErrorCode.invalid_request, message, param=param)


async def _encode_all(
    tokenizer: Tokenizer, info: TokenizerInfo, keys: Iterable[tuple[str, bool]]
) -> dict[tuple[str, bool], list[int] | BatchItemError]:
    """Encode each distinct text once. ``(text, True)`` keys: with special tokens (except for a
    text that starts with the BOS token); ``(text, False)``: without."""
    wanted = dict.fromkeys(keys)
    with_special: list[str] = []
    without: list[str] = []
    for text, special in wanted:
        starts_with_bos = info.bos_token is not None and text.startswith(info.bos_token)
        (with_special if special and not starts_with_bos else without).append(text)
    out: dict[tuple[str, bool], list[int] | BatchItemError] = {}
    for texts_, flag in ((with_special, True), (without, False)):
        if texts_:
            for text, ids in zip(
                texts_, await tokenizer.encode(texts_, add_special_tokens=flag), strict=True
            ):
                out[(text, flag)] = ids
    # a text that starts with BOS was encoded without special tokens but is looked up with
    for text, special in wanted:
        if (text, special) not in out:
            out[(text, special)] = out[(text, False)]
    return out


async def encode_pairs(
    pairs: Sequence[ScoringRequest], tokenizer: Tokenizer | None
) -> list[TokenPair | BatchItemError]:
    """Token ids ``(context, continuation)`` per pair (module doc: the rule), or the pair's
    error: an empty continuation, one that encodes to no tokens, an empty context when the
    tokenizer has no prefix token, a pair that is neither two strings nor two token lists.
    Pairs given as token ids pass through; ``tokenizer`` may be None when every pair is."""
    info = await tokenizer.info() if tokenizer is not None else TokenizerInfo()
    keys: list[tuple[str, bool]] = []
    for pair in pairs:
        context, continuation = _pair(pair)
        if isinstance(context, str) and isinstance(continuation, str) and continuation:
            if context:
                ctx, cont = split_pair(context, continuation)
                keys += [(ctx + cont, True), (ctx, True)]
            else:
                keys.append((continuation, False))
    if keys and tokenizer is None:
        raise ConfigurationError("text pairs need a tokenizer; give token ids instead")
    encoded = await _encode_all(tokenizer, info, keys) if keys and tokenizer else {}
    return [_encode_one(pair, encoded, info) for pair in pairs]


def _pair(pair: Any) -> tuple[Any, Any]:
    if isinstance(pair, tuple | list) and len(pair) == 2:
        return pair[0], pair[1]
    return None, None


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list | tuple) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        return list(value)
    return None


def _encode_one(
    pair: Any, encoded: dict[tuple[str, bool], list[int] | BatchItemError], info: TokenizerInfo
) -> TokenPair | BatchItemError:
    context, continuation = _pair(pair)
    if isinstance(context, str) and isinstance(continuation, str):
        if not continuation:
            return _bad("the continuation is empty: there is nothing to score")
        if not context:
            cont = encoded[(continuation, False)]
            if isinstance(cont, BatchItemError):
                return cont
            prefix = info.prefix_token_id
            if prefix is None:
                return _bad(
                    "an empty context needs the model's BOS or EOS token id, which this "
                    "tokenizer does not give (use a local tokenizer folder)",
                    "context",
                )
            ctx_ids, cont_ids = ([prefix], cont) if cont[:1] != [prefix] else (cont[:1], cont[1:])
        else:
            ctx, cont_text = split_pair(context, continuation)
            whole, ctx_enc = encoded[(ctx + cont_text, True)], encoded[(ctx, True)]
            if isinstance(whole, BatchItemError):
                return whole
            if isinstance(ctx_enc, BatchItemError):
                return ctx_enc
            ctx_ids, cont_ids = ctx_enc, whole[len(ctx_enc) :]
        if not cont_ids:
            return _bad("the continuation encodes to no tokens of its own")
        return ctx_ids, cont_ids
    ctx_ids_, cont_ids_ = _ids(context), _ids(continuation)
    if ctx_ids_ is None or cont_ids_ is None:
        return _bad(
            "a request is (context, continuation): two strings or two lists of token ids",
            "requests",
        )
    if not cont_ids_:
        return _bad("the continuation is empty: there is nothing to score")
    if not ctx_ids_:
        return _bad("the context has no tokens: give at least one (e.g. the BOS token)", "context")
    return ctx_ids_, cont_ids_


def scoring_body(model: str, prompt: list[int]) -> dict[str, Any]:
    """The ``/v1/completions`` body that asks for a prompt's log-probabilities (the body
    lm-evaluation-harness's ``local-completions`` sends for ``loglikelihood``)."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0.0,
        "echo": True,
        "logprobs": 1,
    }


def prompt_logprobs_body(body: dict[str, Any]) -> dict[str, Any]:
    """A scoring body in vLLM's own terms: ``prompt_logprobs: 1`` instead of ``echo`` +
    ``logprobs`` (the prompt's log-probabilities keyed by token id, so two tokens that decode
    to the same text stay apart, and without the echoed text: half the answer)."""
    out = {k: v for k, v in body.items() if k not in ("echo", "logprobs")}
    out["prompt_logprobs"] = 1
    return out


def _scoring_request(
    index: int,
    model: str,
    pair: TokenPair | BatchItemError,
    max_model_len: int | None,
    custom_id: str | None,
) -> Request:
    if isinstance(pair, BatchItemError):
        return Request(
            index=index,
            body={"model": model},
            endpoint=Endpoint.completions,
            custom_id=custom_id,
            error=pair,
        )
    ctx, cont = pair
    prompt = ctx + cont
    error = None
    # one position more: the one token the request generates
    if max_model_len is not None and len(prompt) + 1 > max_model_len:
        error = item_error(
            ErrorCode.context_length_exceeded,
            f"This model's maximum context length is {max_model_len} tokens; the context and "
            f"continuation are {len(prompt)} tokens, and scoring needs one more. The context is "
            "not shortened (that would change the score).",
            status_code=400,
            param="context",
        )
    return Request(
        index=index,
        body=scoring_body(model, prompt),
        endpoint=Endpoint.completions,
        custom_id=custom_id,
        score_span=(len(ctx), len(prompt)),
        error=error,
    )


def loglikelihood_requests(
    model: str,
    encoded: Sequence[TokenPair | BatchItemError],
    max_model_len: int | None,
    custom_ids: Sequence[str] | None,
) -> Iterator[Request]:
    """One scoring request per encoded pair, built lazily (:mod:`.calls`; ``custom_ids`` is
    checked now). An encoding error or an over-long prompt is that request's error, reported
    without being sent."""
    return lazy_requests(
        len(encoded),
        custom_ids,
        "requests",
        lambda i, custom_id: _scoring_request(i, model, encoded[i], max_model_len, custom_id),
    )


def rolling_windows(tokens: list[int], prefix_token: int, max_seq_len: int) -> list[TokenPair]:
    """Disjoint ``(context, continuation)`` windows that together predict every token of
    ``tokens`` once, each at most ``max_seq_len`` predicted tokens conditioned on the tokens
    before them (the first on ``prefix_token``): lm-evaluation-harness's
    ``get_rolling_token_windows(context_len=1)`` followed by ``make_disjoint_window``."""
    if max_seq_len < 1:
        raise ValueError("max_seq_len must be >= 1")
    windows: list[TokenPair] = []
    if not tokens:
        return windows
    first = min(max_seq_len, len(tokens))
    windows.append(([prefix_token], tokens[:first]))
    predicted = first
    while predicted < len(tokens):
        pred_len = min(len(tokens) - predicted, max_seq_len)
        end = predicted + pred_len
        context = tokens[max(end - max_seq_len - 1, 0) : end - 1]
        windows.append((context[: len(context) - (pred_len - 1)], tokens[end - pred_len : end]))
        predicted = end
    return windows


async def rolling_requests(
    model: str,
    texts: Sequence[str],
    tokenizer: Tokenizer,
    custom_ids: Sequence[str] | None,
) -> tuple[list[Request], list[list[int]]]:
    """The scoring requests of every window of every text, and per text the indexes of its
    requests. A text that cannot be scored (empty, not encodable, no prefix token) gets one
    request that carries its error. Raises ``ConfigurationError`` (before encoding anything)
    for ``custom_ids`` not aligned with ``texts``."""
    check_custom_ids(custom_ids, len(texts), "texts")
    info = await tokenizer.info()
    limit = info.max_model_len
    # max_model_len - 1 context token - 1 generated token (lm-eval's vllm backend window)
    max_seq_len = limit - 2 if limit is not None else None
    encoded = await _encode_all(tokenizer, info, [(t, True) for t in texts if isinstance(t, str)])
    requests: list[Request] = []
    owners: list[list[int]] = []
    for i, text in enumerate(texts):
        custom_id = custom_ids[i] if custom_ids else None
        ids = encoded.get((text, True)) if isinstance(text, str) and text else None
        windows: list[TokenPair] | BatchItemError
        if ids is None:
            windows = _bad(
                "the text is empty (or not a string): there is nothing to score", "texts"
            )
        elif isinstance(ids, BatchItemError):
            windows = ids
        elif info.prefix_token_id is None:
            windows = _bad(
                "rolling scores condition the first token on the model's BOS or EOS token, "
                "which this tokenizer does not give (use a local tokenizer folder)",
                "texts",
            )
        elif not ids:
            windows = _bad("the text encodes to no tokens", "texts")
        else:
            windows = rolling_windows(ids, info.prefix_token_id, max_seq_len or len(ids))
        mine: list[int] = []
        for window in windows if isinstance(windows, list) else [windows]:
            mine.append(len(requests))
            requests.append(_scoring_request(len(requests), model, window, limit, custom_id))
        owners.append(mine)
    return requests, owners


def _from_prompt_logprobs(
    entries: list[Any], prompt: list[int], start: int, end: int
) -> tuple[float, bool]:
    """vLLM's ``choices[0].prompt_logprobs``: per position None or ``{token id (as text):
    {"logprob", "rank", "decoded_token"}}``. Greedy: the token's rank is 1 (vLLM's rank: 1 +
    how many tokens are more likely), or without a rank, no entry is more likely."""
    total, greedy = 0.0, True
    for pos in range(start, end):
        step = entries[pos]
        chosen = step[str(prompt[pos])]
        logprob = clamp_logprob(float(chosen["logprob"]))
        total += logprob
        rank = chosen.get("rank")
        if isinstance(rank, int) and not isinstance(rank, bool):
            greedy = greedy and rank == 1
        else:
            best = max(clamp_logprob(float(v["logprob"])) for v in step.values())
            greedy = greedy and logprob >= best
    return total, greedy


def _from_echo_logprobs(logprobs: dict[str, Any], start: int, end: int) -> tuple[float, bool]:
    """OpenAI's legacy ``choices[0].logprobs`` of an echoed prompt: ``token_logprobs[i]`` and
    ``top_logprobs[i]`` (``{token text: logprob}``) per position."""
    token_logprobs, top = logprobs["token_logprobs"], logprobs["top_logprobs"]
    total, greedy = 0.0, True
    for pos in range(start, end):
        logprob = clamp_logprob(float(token_logprobs[pos]))
        total += logprob
        alternatives = top[pos] or {}
        best = max((clamp_logprob(float(v)) for v in alternatives.values()), default=logprob)
        greedy = greedy and logprob >= best
    return total, greedy


def to_loglikelihood(request: Request, result: Result) -> LoglikelihoodResponse:
    """The score of one scoring result. Never raises: an answer without the prompt's
    log-probabilities at the scored positions becomes ``bad_upstream_response``."""
    custom_id = request.custom_id
    if result.error is not None:
        return LoglikelihoodResponse(error=result.error, custom_id=custom_id)
    assert request.score_span is not None, "not a scoring request"
    start, end = request.score_span
    prompt = request.body.get("prompt")
    choices = (result.body or {}).get("choices")
    try:
        choice = choices[0]  # type: ignore[index]
        entries = choice.get("prompt_logprobs")
        if isinstance(entries, list) and len(entries) >= end:
            total, greedy = _from_prompt_logprobs(entries, list(prompt or ()), start, end)
        else:
            total, greedy = _from_echo_logprobs(choice["logprobs"], start, end)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        detail = json.dumps(result.body)[:300]
        return LoglikelihoodResponse(
            error=item_error(
                ErrorCode.bad_upstream_response,
                f"answer without the prompt's log-probabilities ({type(exc).__name__}: {exc}): "
                f"{detail}",
                status_code=result.status_code,
            ),
            custom_id=custom_id,
        )
    return LoglikelihoodResponse(
        logprob=total, is_greedy=greedy, num_tokens=end - start, custom_id=custom_id
    )


def combine_windows(parts: Sequence[LoglikelihoodResponse]) -> LoglikelihoodResponse:
    """One text's rolling score from its windows' scores: the sum, greedy when every window
    is, the first error when any window failed."""
    custom_id = parts[0].custom_id if parts else None
    for part in parts:
        if part.error is not None:
            return LoglikelihoodResponse(error=part.error, custom_id=custom_id)
    return LoglikelihoodResponse(
        logprob=sum(p.logprob or 0.0 for p in parts),
        is_greedy=all(bool(p.is_greedy) for p in parts),
        num_tokens=sum(p.num_tokens or 0 for p in parts),
        custom_id=custom_id,
    )
