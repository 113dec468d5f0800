"""Embeddings: ``batch_embeddings``'s arguments -> ``/v1/embeddings`` requests (one input per
request, so each input has its own result and error), and results -> ``EmbeddingResponse``.

The answer is OpenAI's ``CreateEmbeddingResponse`` (``{"object": "list", "data": [{"object":
"embedding", "index": 0, "embedding": [...] | "<base64>"}], "model", "usage"}``), as vLLM's
server and the inline pooling engine return it.
"""

from __future__ import annotations

import array
import base64
import json
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import ConfigurationError, ErrorCode
from ..types import BatchItemError, EmbeddingResponse, EncodingFormat, Endpoint
from .calls import lazy_requests
from .completions import result_metrics
from .request import Request, Result, item_error

__all__ = ["as_requested", "embedding_requests", "to_embedding_response"]

ENCODING_FORMATS = ("float", "base64")


def embedding_requests(
    model: str,
    inputs: Sequence[str | Sequence[int]],
    encoding_format: EncodingFormat = "float",
    custom_ids: Sequence[str] | None = None,
) -> Iterator[Request]:
    """One ``/v1/embeddings`` request per input (text, or token ids). ``encoding_format`` and
    ``custom_ids`` are checked now (``ConfigurationError``), the requests are built lazily
    (:mod:`.calls`). An empty input, or one that is neither, gets an ``invalid_request`` error
    at its position."""
    if encoding_format not in ENCODING_FORMATS:
        raise ConfigurationError(
            f"encoding_format must be one of {ENCODING_FORMATS}, not {encoding_format!r}"
        )

    def build(i: int, custom_id: str | None) -> Request:
        wire = _input(inputs[i])
        if isinstance(wire, BatchItemError):
            return Request(
                index=i,
                body={"model": model},
                endpoint=Endpoint.embeddings,
                custom_id=custom_id,
                error=wire,
            )
        return Request(
            index=i,
            body={"model": model, "input": wire, "encoding_format": encoding_format},
            endpoint=Endpoint.embeddings,
            custom_id=custom_id,
        )

    return lazy_requests(len(inputs), custom_ids, "inputs", build)


def _input(value: Any) -> str | list[int] | BatchItemError:
    if isinstance(value, str):
        if value:
            return value
        return item_error(ErrorCode.invalid_request, "the input is empty", param="input")
    if isinstance(value, list | tuple) and value and all(_token_id(t) for t in value):
        return list(value)
    return item_error(
        ErrorCode.invalid_request,
        "an input must be a non-empty string or a non-empty list of token ids",
        param="input",
    )


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def to_embedding_response(request: Request, result: Result) -> EmbeddingResponse:
    """The protocol's ``EmbeddingResponse`` for one result. Never raises: an answer without
    one embedding (a list of numbers, or base64 text) becomes ``bad_upstream_response``."""
    custom_id = request.custom_id
    if result.error is not None:
        return EmbeddingResponse(error=result.error, custom_id=custom_id)
    body = result.body or {}
    data = body.get("data")
    entry = data[0] if isinstance(data, list) and data else None
    vector = entry.get("embedding") if isinstance(entry, dict) else None
    valid = isinstance(vector, str) or (
        isinstance(vector, list)
        and bool(vector)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in vector)
    )
    if not valid:
        return EmbeddingResponse(
            error=item_error(
                ErrorCode.bad_upstream_response,
                f"answer without an embedding: {json.dumps(body)[:300]}",
                status_code=result.status_code,
            ),
            custom_id=custom_id,
        )
    embedding = vector if isinstance(vector, str) else [float(v) for v in vector]  # type: ignore[union-attr]
    return EmbeddingResponse(
        embedding=embedding, metrics=result_metrics(result), custom_id=custom_id
    )


def as_requested(request_body: dict[str, Any], result: Result) -> Result:
    """``result`` with its embeddings in the ``encoding_format`` the request asked for: floats
    made the base64 text of the little-endian float32 array (OpenAI's form) for a request
    that asked ``base64`` of a provider that answers floats only (Gemini's batches)."""
    body = result.body
    if request_body.get("encoding_format") != "base64" or not isinstance(body, dict):
        return result
    for entry in body.get("data") or ():
        vector = entry.get("embedding") if isinstance(entry, dict) else None
        if isinstance(vector, list) and all(isinstance(v, float) for v in vector):
            floats = array.array("f", vector)
            if sys.byteorder == "big":
                floats.byteswap()
            entry["embedding"] = base64.b64encode(floats.tobytes()).decode()
    return result
