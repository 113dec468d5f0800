"""Text completions: ``batch_completion``'s arguments -> ``/v1/completions`` requests, and
results -> ``CompletionResponse``.

The body is OpenAI's legacy completions body (``prompt`` as text; the sampling fields as for
chat, :func:`~.encode.sampling_to_wire`), which vLLM servers, the inline engine and other
OpenAI-compatible servers take. ``max_tokens`` unset (0) leaves the endpoint's default: 16
tokens on OpenAI and vLLM servers, and the same inline.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import ErrorCode
from ..types import (
    BatchItemError,
    CompletionResponse,
    Endpoint,
    InterleavedContent,
    JsonSchemaResponseFormat,
    LogProbConfig,
    MetricInResponse,
    ResponseFormat,
    ResponseFormatArg,
    SamplingParams,
    StopReason,
    TokenLogProbs,
)
from .calls import aligned, lazy_requests, per_item_sampling
from .checks import check_answer
from .decode import FINISH_REASONS, clamp_logprob, usage_metrics
from .encode import (
    _coerce_logprobs,
    _coerce_response_format,
    content_to_wire,
    response_format_to_wire,
    sampling_to_wire,
)
from .request import Request, Result, item_error

__all__ = [
    "completion_requests",
    "parse_completion_logprobs",
    "result_metrics",
    "to_completion_response",
]


def completion_requests(
    model: str,
    content_batch: Sequence[InterleavedContent],
    sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    response_format: ResponseFormatArg | Sequence[ResponseFormatArg] = None,
    logprobs: LogProbConfig | Sequence[LogProbConfig | None] | None = None,
    custom_ids: Sequence[str] | None = None,
) -> Iterator[Request]:
    """One ``/v1/completions`` request per prompt. Lists must be aligned with
    ``content_batch``; every argument is checked now (``ConfigurationError``), the requests are
    built lazily (:mod:`.calls`). A prompt that is not text (an image) gets an
    ``invalid_request`` error at its position."""
    n = len(content_batch)
    params = per_item_sampling(sampling_params, n, _ITEMS)
    formats: list[ResponseFormat | None]
    formats = aligned("response_format", response_format, n, _ITEMS, _coerce_response_format)
    per_item_logprobs: list[LogProbConfig | None]
    per_item_logprobs = aligned("logprobs", logprobs, n, _ITEMS, _coerce_logprobs)

    def build(i: int, custom_id: str | None) -> Request:
        prompt = _prompt_text(content_batch[i])
        if isinstance(prompt, BatchItemError):
            return Request(
                index=i,
                body={"model": model},
                endpoint=Endpoint.completions,
                custom_id=custom_id,
                error=prompt,
            )
        body: dict[str, Any] = {"model": model, "prompt": prompt}
        body.update(sampling_to_wire(params[i]))
        fmt = formats[i]
        if fmt is not None:
            body.update(response_format_to_wire(fmt))
        config = per_item_logprobs[i]
        if config is not None:
            body["logprobs"] = config.top_k
        return Request(
            index=i,
            body=body,
            endpoint=Endpoint.completions,
            custom_id=custom_id,
            response_schema=fmt.json_schema if isinstance(fmt, JsonSchemaResponseFormat) else None,
        )

    return lazy_requests(n, custom_ids, _ITEMS, build)


_ITEMS = "prompts"


def _prompt_text(content: Any) -> str | BatchItemError:
    try:
        wire = content_to_wire(content)
    except (AttributeError, TypeError):
        wire = None
    if isinstance(wire, str):
        return wire
    return item_error(
        ErrorCode.invalid_request,
        f"a completion prompt must be text, not {type(content).__name__}",
        param="content_batch",
    )


def parse_completion_logprobs(choice: dict[str, Any]) -> list[TokenLogProbs] | None:
    """OpenAI's legacy ``choices[0].logprobs`` (``tokens``, ``token_logprobs``,
    ``top_logprobs``) as one ``TokenLogProbs`` per token (echoed prompt positions included;
    a position without a log-probability, the first of an echoed prompt, is left out). Values
    are clamped (:func:`~.decode.clamp_logprob`); malformed parts are read as absent."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or not isinstance(lp.get("tokens"), list):
        return None
    tokens, values, tops = lp["tokens"], lp.get("token_logprobs"), lp.get("top_logprobs")
    values = values if isinstance(values, list) else []
    tops = tops if isinstance(tops, list) else []
    out: list[TokenLogProbs] = []
    for i, token in enumerate(tokens):
        value = values[i] if i < len(values) else None
        if value is None:
            continue
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        by_token = {str(k): clamp_logprob(v) for k, v in top.items()}
        by_token[str(token)] = clamp_logprob(value)
        out.append(TokenLogProbs(logprobs_by_token=by_token))
    return out


def to_completion_response(request: Request, result: Result) -> CompletionResponse:
    """The protocol's ``CompletionResponse`` for one result. Never raises: a body without a
    usable text choice becomes ``bad_upstream_response``; a JSON answer that does not match its
    schema (or a grammar answer cut off by ``max_tokens``) becomes
    ``invalid_structured_output``."""
    custom_id = request.custom_id
    if result.error is not None:
        return CompletionResponse(error=result.error, custom_id=custom_id)
    body = result.body or {}
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict) or not isinstance(choice.get("text"), str):
        return CompletionResponse(
            error=item_error(
                ErrorCode.bad_upstream_response,
                f"answer without a text choice: {json.dumps(body)[:300]}",
                status_code=result.status_code,
            ),
            custom_id=custom_id,
        )
    text = choice["text"]
    finish = choice.get("finish_reason") or "stop"
    _, problem = check_answer(request, {"content": text}, text, finish)
    if problem is not None:
        return CompletionResponse(error=problem, custom_id=custom_id)
    return CompletionResponse(
        content=text,
        stop_reason=FINISH_REASONS.get(finish, StopReason.end_of_turn),
        logprobs=parse_completion_logprobs(choice),
        metrics=result_metrics(result),
        custom_id=custom_id,
    )


def result_metrics(result: Result) -> list[MetricInResponse]:
    """``usage`` token counts, time to first token, latency and ``cached`` (an answer from the
    result cache) of one result (as for chat)."""
    metrics = usage_metrics((result.body or {}).get("usage"))
    if result.ttft_s is not None:
        metrics.append(
            MetricInResponse(metric="time_to_first_token", value=result.ttft_s, unit="s")
        )
    if result.latency_s is not None:
        metrics.append(MetricInResponse(metric="latency", value=result.latency_s, unit="s"))
    if result.cached:
        metrics.append(MetricInResponse(metric="cached", value=1))
    return metrics
