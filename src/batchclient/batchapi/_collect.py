"""An ended remote batch's results (normalised lines, :mod:`._backend`) back into result rows.

Each line is read on its own: a line that is not JSON, not an object or names no request is
skipped (its request then reads as missing), and a line whose answer is malformed is that one
request's ``bad_upstream_response``; the other requests of the batch keep their results.

Blocking (run it through ``anyio.to_thread``) and streaming: only an index of where each
request's line is (``custom_id`` or line number -> byte offset) is kept in memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from .._core.decode import http_error
from .._core.request import Result, failed, item_error
from ..errors import ErrorCode
from ..jobs._store import Store
from ..jobs._validate import RequestLine
from ._parts import Committer, Part, part_lines

__all__ = ["collect", "line_result", "one_result"]

UNRUN = frozenset({"batch_expired", "batch_cancelled"})
"""Codes of a request its batch did not run: it stays unfinished (resubmitted, re-run live or
filled in when the job ends)."""
_MAX_COUNT = 2**53
"""The largest token count taken as one (a JSON number beyond it is not a count)."""


def line_result(obj: Any) -> Result | None:
    """The result of one normalised line (or OpenAI output / error line); None for a request
    its batch did not run (``batch_expired`` / ``batch_cancelled``)."""
    if not isinstance(obj, dict):
        return _bad("the remote output line is not a JSON object")
    response, error = obj.get("response"), obj.get("error")
    if isinstance(response, dict) and isinstance(response.get("status_code"), int):
        status, body = response["status_code"], response.get("body")
        if 200 <= status < 300:
            if not isinstance(body, dict):
                result = _bad(f"HTTP {status} answer without a JSON object body", status)
            elif (why := _usage_problem(body)) is not None:
                result = _bad(why, status)
            else:
                result = Result(status_code=status, body=body)
        else:
            result = http_error(status, json.dumps(body) if body is not None else None)
        request_id = response.get("request_id")
        result.request_id = request_id if isinstance(request_id, str) else None
        return result
    if isinstance(error, dict):
        code = str(error.get("code") or ErrorCode.server_error.value)
        if code in UNRUN:
            return None
        message = str(error.get("message") or "the remote batch reported an error")
        param = error.get("param")
        return Result(
            None,
            None,
            error=item_error(code, message, param=param if isinstance(param, str) else None),
        )
    return _bad("the remote output line has neither a response nor an error")


def _usage_problem(body: dict[str, Any]) -> str | None:
    """Why the answer's ``usage`` is not token counts (None: it is, or there is none)."""
    usage = body.get("usage")
    if usage is None:
        return None
    if not isinstance(usage, dict):
        return "the answer's usage is not an object"
    for key, value in usage.items():
        count = isinstance(value, int | float) and not isinstance(value, bool)
        if key.endswith("_tokens") and not (count and 0 <= value < _MAX_COUNT):
            return f"the answer's usage.{key} is not a token count: {str(value)[:40]}"
    return None


def _bad(message: str, status: int | None = None) -> Result:
    result = failed(ErrorCode.bad_upstream_response, message)
    if result.error is not None:
        result.error.status_code = status
    return result


class _Index:
    """Where each request's line is in the results file (byte offsets), and the ``rest``
    line if any."""

    def __init__(self, path: Path) -> None:
        self.by_id: dict[str, int] = {}
        self.by_line: dict[int, int] = {}
        self.rest: dict[str, Any] | None = None
        with path.open("rb") as f:
            offset = 0
            for raw in f:
                self._add(raw, offset)
                offset += len(raw)

    def _add(self, raw: bytes, offset: int) -> None:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return  # names no request: its request reads as missing
        if not isinstance(obj, dict):
            return
        cid, line = obj.get("custom_id"), obj.get("line")
        if isinstance(cid, str):
            self.by_id.setdefault(cid, offset)  # the first line wins
        elif isinstance(line, int) and not isinstance(line, bool):
            self.by_line.setdefault(line, offset)
        elif obj.get("rest") is True and self.rest is None:
            self.rest = obj


def collect(
    store: Store,
    job_id: str,
    input_path: Path,
    part: Part,
    path: Path,
    *,
    wire_id: Callable[[RequestLine], str],
    complete: bool,
    resubmit: bool,
) -> int:
    """Commit the results of an ended remote batch from its results file ``path``; return how
    many of its requests stay unfinished (to be resubmitted, re-run live or filled in).

    ``wire_id``: the id each request was sent under. ``complete``: the batch ran everything,
    so a request without a result is a ``bad_upstream_response`` item (otherwise it was not
    run). ``resubmit``: a ``retryable`` result stays unfinished, to go into a new batch,
    instead of being committed."""
    index = _Index(path)
    sink = Committer(store, job_id)
    unfinished = 0
    with path.open("rb") as f:
        for number, line in enumerate(part_lines(store, job_id, input_path, part), start=1):
            where = index.by_id.get(wire_id(line))
            where = index.by_line.get(number) if where is None else where
            obj: Any
            if where is not None:
                f.seek(where)
                obj = orjson.loads(f.readline())
            elif index.rest is not None:
                obj = index.rest
            elif complete:
                obj = {"error": {"code": ErrorCode.bad_upstream_response.value, "message": (
                    "the remote batch ended without a result for this request"
                )}}  # fmt: skip
            else:
                obj = None  # not run
            result = None if obj is None else line_result(obj)
            if result is None or (resubmit and obj.get("retryable") is True):
                unfinished += 1
                continue
            sink.add(line, result)
    sink.flush()
    return unfinished


def one_result(path: Path, wire: str) -> Result | None:
    """The result of the one request of a one-request batch (sent under ``wire``) in the
    results file ``path``; None when the batch did not run it or names it nowhere."""
    index = _Index(path)
    where = index.by_id.get(wire, index.by_line.get(1))
    if where is None:
        return None if index.rest is None else line_result(index.rest)
    with path.open("rb") as f:
        f.seek(where)
        return line_result(orjson.loads(f.readline()))
