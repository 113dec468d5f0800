"""Gemini batch files: a part's requests (as the SDK's inline requests), and results (inline
answers or a responses file) as normalised lines (:mod:`._backend`), each answer read on its
own: one that is malformed is its own request's ``bad_upstream_response``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from .._core.decode import http_error
from ..errors import ErrorCode
from ._backend import error_line, json_lines, ok_line
from ._gemini_translate import status_of, to_completion, to_embedding
from ._parts import private_file

__all__ = ["first_model", "inline_requests", "write_file", "write_inline"]

_RETRYABLE_STATUS = frozenset(
    {"UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"}
)
"""Per-request ``google.rpc.Status`` codes a later batch may not get: resubmitted."""


def first_model(path: Path) -> str:
    """The part's model: every request of a job names the same one (a batch file with two
    models fails validation, ``mismatched_model``), as a Gemini batch runs one model."""
    with path.open("rb") as f:
        return str(orjson.loads(f.readline())["request"]["model"])


def inline_requests(path: Path) -> tuple[str, list[Any]]:
    """The part file's requests as the SDK's ``InlinedRequest`` objects (its ``config`` carries
    what the SDK moves back into the request: ``generationConfig`` fields, ``systemInstruction``,
    ``tools``, ``toolConfig``, ``cachedContent``); and the first request's model."""
    from google.genai import types

    requests: list[Any] = []
    model = ""
    with path.open("rb") as f:
        for raw in f:
            line = orjson.loads(raw)
            request = dict(line["request"])
            own = request.pop("model")
            model = model or own
            config = dict(request.pop("generationConfig", {}))
            for key in ("systemInstruction", "tools", "toolConfig", "cachedContent"):
                if key in request:
                    config[key] = request.pop(key)
            requests.append(
                types.InlinedRequest(
                    model=own,
                    contents=request.pop("contents"),
                    metadata={"key": line["key"]},
                    config=types.GenerateContentConfig.model_validate(config) if config else None,
                )
            )
    return model, requests


def normalised(key: str, response: Any, error: Any, model: str) -> bytes:
    if isinstance(error, dict) and error:
        status = str(error.get("status") or "")
        message = str(error.get("message") or "the remote batch reported an error")
        http = status_of(error)
        retryable = status in _RETRYABLE_STATUS or http in (429, 500, 503, 504)
        code = http_error(http, message).error
        assert code is not None
        return error_line(key, code.code, f"{status or http}: {message}", retryable=retryable)
    if not isinstance(response, dict):
        return error_line(key, ErrorCode.bad_upstream_response.value, "no response and no error")
    name = model.removeprefix("models/")
    if "embedding" in response:  # an EmbedContentResponse (an embeddings batch)
        return ok_line(key, lambda: to_embedding(response, name))
    return ok_line(key, lambda: to_completion(response, name, key))


def write_inline(entries: list[Any], model: str, dest: Path) -> None:
    with private_file(dest) as out:
        for entry in entries:
            meta = entry.get("metadata") if isinstance(entry, dict) else None
            key = meta.get("key") if isinstance(meta, dict) else None
            if isinstance(key, str):  # else its request reads as missing
                out.write(normalised(key, entry.get("response"), entry.get("error"), model))


def write_file(raw: Path, model: str, dest: Path) -> None:
    with private_file(dest) as out:
        for obj in json_lines(raw):
            if isinstance(obj, dict) and isinstance(obj.get("key"), str):
                out.write(normalised(obj["key"], obj.get("response"), obj.get("error"), model))
