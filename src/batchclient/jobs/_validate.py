"""Validation of an OpenAI batch input file (JSONL), streamed, all-or-nothing.

Rules (the OpenAI Batch API, https://platform.openai.com/docs/guides/batch): every non-blank line is
``{"custom_id": str (unique), "method": "POST", "url": <the batch's endpoint>, "body": {"model":
str, ...}}``; one endpoint and one model per file; ``stream: true`` is refused. The body needs
``messages`` (a non-empty list of objects with a ``role``) for ``/v1/chat/completions``,
``prompt`` for ``/v1/completions`` and ``input`` for ``/v1/embeddings`` (each text, token ids,
or a non-empty list of either; no empty text to embed), ``input`` for ``/v1/responses`` (text or
a non-empty list of input items) and ``/v1/moderations`` (text or a non-empty list). One error
per bad line, with OpenAI's code, the 1-based *physical* line number and ``param``. Blank and
whitespace-only lines are skipped and not counted; ``\\r\\n`` endings and a UTF-8 BOM are
tolerated (the BOM is dropped); anything that is not UTF-8 is refused with a message naming what
it looks like: a UTF-16 or UTF-32 file (with or without a BOM; the pattern of NUL bytes tells,
as in RFC 4627 section 3) once for the whole file, other encodings line by line.

The file is read line by line and never held in memory; duplicate ``custom_id`` detection uses a
private temporary on-disk SQLite database (SQLite's empty file name), so memory stays flat
whatever the number of lines. Guide: ``docs/jobs.md`` ("The file format").
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from ..errors import ErrorCode
from ..types import BatchError, Endpoint

MAX_LINE_BYTES = 32 * 1024 * 1024
"""Longest accepted line (32 MiB); longer lines are refused without being read into memory."""
MAX_LISTED_ERRORS = 1000
"""At most this many errors are listed; one more entry says how many were left out."""

_UTF16_32_BOMS = {  # UTF-32 first: its little-endian BOM starts with UTF-16's
    b"\xff\xfe\x00\x00": ("UTF-32 (little-endian, with BOM)", "UTF-32"),
    b"\x00\x00\xfe\xff": ("UTF-32 (big-endian, with BOM)", "UTF-32"),
    b"\xff\xfe": ("UTF-16 (little-endian, with BOM)", "UTF-16"),
    b"\xfe\xff": ("UTF-16 (big-endian, with BOM)", "UTF-16"),
}
SNIFF_BYTES = 4096
"""How much of the start of a file is looked at to tell UTF-16 and UTF-32 from UTF-8."""


@dataclass
class ValidationReport:
    """What validation found: ``total`` request lines, the file's ``model``, and ``errors``
    (empty when the file is valid). ``error_count`` counts every bad line, listed or not."""

    total: int = 0
    model: str | None = None
    errors: list[BatchError] = field(default_factory=list)
    error_count: int = 0

    @property
    def ok(self) -> bool:
        return self.error_count == 0

    def add(self, code: ErrorCode, message: str, line: int | None, param: str | None) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_LISTED_ERRORS:
            self.errors.append(BatchError(code=code.value, message=message, line=line, param=param))


@dataclass(slots=True)
class RequestLine:
    """One valid request line: ``seq`` is its 0-based position among request lines, ``line``
    its 1-based physical line number."""

    seq: int
    line: int
    custom_id: str
    body: dict[str, Any]


def iter_lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes | None]]:
    """``(physical line number, bytes without the line ending)``; ``None`` for a line longer
    than :data:`MAX_LINE_BYTES` (skipped without holding it in memory). A UTF-8 BOM at the start
    of the file is dropped."""
    number = 0
    while True:
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # discard the rest of this line
                raw = stream.readline(1024 * 1024)
            yield number, None
            continue
        yield number, raw.rstrip(b"\r\n")


def is_blank(raw: bytes) -> bool:
    return not raw.strip()


def describe_encoding(raw: bytes, exc: UnicodeDecodeError) -> str:
    """A message naming what a line that is not UTF-8 looks like."""
    byte = raw[exc.start : exc.start + 1].hex()
    if b"\x00" in raw:
        guess = "UTF-16 or UTF-32 (it contains NUL bytes)"
    else:
        guess = "a legacy 8-bit encoding such as Windows-1252 or Latin-1 (ISO-8859-1)"
    return (
        f"not valid UTF-8 (byte 0x{byte} at offset {exc.start}); it looks like {guess}. "
        "Batch files must be UTF-8: re-encode the file (e.g. `iconv -t UTF-8`)"
    )


def sniff_wide_encoding(head: bytes) -> tuple[str, str] | None:
    """``(description, iconv name)`` when the start of a file is UTF-16 or UTF-32, else None.

    A BOM says so outright. Without one, the NUL bytes tell (RFC 4627 section 3): JSON is mostly
    ASCII, and an ASCII character is one non-NUL byte followed (little-endian) or preceded
    (big-endian) by one NUL in UTF-16 and by three in UTF-32; in UTF-32 the two high bytes of
    every character below U+10000 are NUL. UTF-8 text has no NUL bytes at all (JSON does not
    allow a raw NUL even inside a string)."""
    for bom, names in _UTF16_32_BOMS.items():
        if head.startswith(bom):
            return names
    sample = head[:SNIFF_BYTES]
    if b"\x00" not in sample or len(sample) < 2:
        return None
    units = len(sample) // 4
    if units:
        zeros = [sample[i : units * 4 : 4].count(0) / units for i in range(4)]
        if zeros[2] > 0.95 and zeros[3] > 0.95 and zeros[0] < 0.5:
            return "UTF-32 (little-endian, no BOM)", "UTF-32LE"
        if zeros[0] > 0.95 and zeros[1] > 0.95 and zeros[3] < 0.5:
            return "UTF-32 (big-endian, no BOM)", "UTF-32BE"
    pairs = len(sample) // 2
    even = sample[0 : pairs * 2 : 2].count(0) / pairs
    odd = sample[1 : pairs * 2 : 2].count(0) / pairs
    if odd >= 0.3 and odd > 3 * even:
        return "UTF-16 (little-endian, no BOM)", "UTF-16LE"
    if even >= 0.3 and even > 3 * odd:
        return "UTF-16 (big-endian, no BOM)", "UTF-16BE"
    return None


def parse_line(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """Decode and parse one non-blank line: ``(object, None)`` or ``(None, problem)``. Never
    raises (deep nesting, bad UTF-8, non-objects, a lone surrogate escape and an integer
    outside 64 bits become problems)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, "encoding:" + describe_encoding(raw, exc)
    try:
        value = json.loads(text, parse_int=_int64)
    except _OutOfRange as exc:
        return None, f"request:line holds the integer {exc}, outside the 64-bit range of any API"
    except (ValueError, RecursionError) as exc:
        return None, f"json:line is not valid JSON: {str(exc)[:200]}"
    if not isinstance(value, dict):
        return None, f"json:line is JSON but not an object (got {type(value).__name__})"
    if "\\u" in text and _lone_surrogate(value):  # only an escape can write one
        return None, (
            "json:line holds a lone surrogate escape (\\ud800-\\udfff without its pair), which "
            "is no character and cannot be sent (RFC 8259, section 8.2)"
        )
    return value, None


class _OutOfRange(Exception):
    pass


def _int64(literal: str) -> int:
    value = int(literal)
    if not -(2**63) <= value < 2**63:
        shown = literal if len(literal) <= 40 else f"{literal[:40]}... ({len(literal)} digits)"
        raise _OutOfRange(shown)
    return value


def _lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_request(obj: dict[str, Any], endpoint: str) -> tuple[ErrorCode, str, str] | None:
    """The first problem of one parsed line as ``(code, message, param)``, or None."""
    for key in ("custom_id", "method", "url", "body"):
        if key not in obj:
            return ErrorCode.missing_required_parameter, f"missing required field {key!r}", key
    custom_id = obj["custom_id"]
    if not isinstance(custom_id, str) or not custom_id:
        return ErrorCode.invalid_request, "custom_id must be a non-empty string", "custom_id"
    if obj["method"] != "POST":
        return ErrorCode.invalid_request, f"method must be POST, not {obj['method']!r}", "method"
    if obj["url"] != endpoint:
        return (
            ErrorCode.invalid_url,
            f"url {str(obj['url'])[:100]!r} does not match this batch's endpoint {str(endpoint)!r}",
            "url",
        )
    body = obj["body"]
    if not isinstance(body, dict):
        return ErrorCode.invalid_request, "body must be a JSON object", "body"
    if "model" not in body:
        return ErrorCode.missing_required_parameter, "body has no 'model'", "body.model"
    if not isinstance(body["model"], str) or not body["model"]:
        return ErrorCode.invalid_request, "body.model must be a non-empty string", "body.model"
    bad = _BODY_CHECKS.get(endpoint, _check_chat)(body)
    if bad is not None:
        return bad
    if body.get("stream") not in (None, False):
        return (
            ErrorCode.streaming_unsupported,
            "stream must be false or absent in a batch (answers are written to the output file)",
            "body.stream",
        )
    return None


Problem = tuple[ErrorCode, str, str]


def _check_chat(body: dict[str, Any]) -> Problem | None:
    if "messages" not in body:
        return ErrorCode.missing_required_parameter, "body has no 'messages'", "body.messages"
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        return ErrorCode.invalid_request, "body.messages must be a non-empty list", "body.messages"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return (
                ErrorCode.invalid_request,
                f"body.messages[{i}] must be an object with a string 'role'",
                "body.messages",
            )
    return None


def _is_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    )


def _text_or_tokens(body: dict[str, Any], key: str, *, allow_empty_text: bool) -> Problem | None:
    """``body[key]`` is text, token ids, or a non-empty list of either (OpenAI's ``prompt`` and
    ``input``)."""
    param = f"body.{key}"
    if key not in body:
        return ErrorCode.missing_required_parameter, f"body has no {key!r}", param
    value = body[key]
    if isinstance(value, str):
        ok = allow_empty_text or bool(value)
    elif _is_ids(value):
        ok = True
    elif isinstance(value, list) and value:
        ok = all((isinstance(v, str) and (allow_empty_text or v)) or _is_ids(v) for v in value)
    else:
        ok = False
    if ok:
        return None
    return (
        ErrorCode.invalid_request,
        f"body.{key} must be text, a list of token ids, or a non-empty list of either"
        + ("" if allow_empty_text else " (no empty text)"),
        param,
    )


def _check_completions(body: dict[str, Any]) -> Problem | None:
    return _text_or_tokens(body, "prompt", allow_empty_text=True)


def _check_embeddings(body: dict[str, Any]) -> Problem | None:
    bad = _text_or_tokens(body, "input", allow_empty_text=False)
    if bad is None and body.get("encoding_format") not in (None, "float", "base64"):
        return (
            ErrorCode.invalid_request,
            "body.encoding_format must be 'float' or 'base64'",
            "body.encoding_format",
        )
    return bad


def _check_responses(body: dict[str, Any]) -> Problem | None:
    if "input" not in body:
        return ErrorCode.missing_required_parameter, "body has no 'input'", "body.input"
    value = body["input"]
    if isinstance(value, str) or (isinstance(value, list) and value):
        if isinstance(value, list) and not all(isinstance(item, dict) for item in value):
            return ErrorCode.invalid_request, "body.input items must be objects", "body.input"
        return None
    return ErrorCode.invalid_request, "body.input must be text or a non-empty list", "body.input"


def _check_moderations(body: dict[str, Any]) -> Problem | None:
    if "input" not in body:
        return ErrorCode.missing_required_parameter, "body has no 'input'", "body.input"
    value = body["input"]
    if isinstance(value, str) or (isinstance(value, list) and value):
        return None
    return ErrorCode.invalid_request, "body.input must be text or a non-empty list", "body.input"


_BODY_CHECKS: dict[str, Callable[[dict[str, Any]], Problem | None]] = {
    Endpoint.chat_completions: _check_chat,
    Endpoint.completions: _check_completions,
    Endpoint.embeddings: _check_embeddings,
    Endpoint.responses: _check_responses,
    Endpoint.moderations: _check_moderations,
}


class _SeenIds:
    """Custom ids seen so far, with the line of their first use, on disk (flat memory)."""

    def __init__(self) -> None:
        self._db = sqlite3.connect("")  # "" = private temporary on-disk database
        self._db.execute(
            "CREATE TABLE seen(custom_id TEXT PRIMARY KEY, line INTEGER) WITHOUT ROWID"
        )

    def first_line(self, custom_id: str, line: int) -> int | None:
        """Record ``custom_id``; return the line of its first use if it was seen before."""
        cur = self._db.execute("INSERT OR IGNORE INTO seen VALUES (?, ?)", (custom_id, line))
        if cur.rowcount:
            return None
        row = self._db.execute("SELECT line FROM seen WHERE custom_id = ?", (custom_id,)).fetchone()
        return int(row[0])

    def close(self) -> None:
        self._db.close()


def validate_batch_file(
    stream: IO[bytes],
    *,
    endpoint: str = Endpoint.chat_completions,
    on_request: Callable[[RequestLine], None] | None = None,
) -> ValidationReport:
    """Validate a whole batch input file read from a binary stream (seekable). Never raises on
    bad content; every problem is a :class:`BatchError` in the report. ``on_request`` is called
    with every valid request line, in file order (its ``seq`` is meaningful when the whole file
    turns out valid)."""
    report = ValidationReport()
    head = stream.read(SNIFF_BYTES)
    wide = sniff_wide_encoding(head)
    if wide is not None:
        name, iconv = wide
        report.add(
            ErrorCode.invalid_encoding,
            f"the file looks like {name}, not UTF-8; batch files must be UTF-8: re-encode it, "
            f"e.g. `iconv -f {iconv} -t UTF-8 IN > OUT`",
            1,
            None,
        )
        return report
    stream.seek(0)
    seen = _SeenIds()
    first_model_line = 0
    try:
        for number, raw in iter_lines(stream):
            if raw is None:
                report.add(
                    ErrorCode.invalid_request,
                    f"line longer than {MAX_LINE_BYTES} bytes",
                    number,
                    None,
                )
                report.total += 1
                continue
            if is_blank(raw):
                continue
            report.total += 1
            obj, problem = parse_line(raw)
            if obj is None:
                assert problem is not None
                kind, message = problem.split(":", 1)
                code = ErrorCode.invalid_json_line
                if kind == "encoding":
                    code = ErrorCode.invalid_encoding
                elif kind == "request":
                    code = ErrorCode.invalid_request
                report.add(code, message, number, None)
                continue
            bad = check_request(obj, endpoint)
            if bad is not None:
                report.add(bad[0], bad[1], number, bad[2])
                continue
            first = seen.first_line(obj["custom_id"], number)
            if first is not None:
                report.add(
                    ErrorCode.duplicate_custom_id,
                    f"custom_id {obj['custom_id'][:100]!r} is already used on line {first}; "
                    "custom_id must be unique for each request in a batch",
                    number,
                    "custom_id",
                )
                continue
            model = obj["body"]["model"]
            if on_request is not None:
                on_request(RequestLine(report.total - 1, number, obj["custom_id"], obj["body"]))
            if report.model is None:
                report.model, first_model_line = model, number
            elif model != report.model:
                report.add(
                    ErrorCode.mismatched_model,
                    f"line uses model {model[:100]!r} but line {first_model_line} uses "
                    f"{report.model!r}; a batch file must use one model",
                    number,
                    "body.model",
                )
    finally:
        seen.close()
    if report.total == 0:
        report.add(ErrorCode.empty_file, "the file has no request lines", None, None)
    elif report.error_count > len(report.errors):
        left_out = report.error_count - len(report.errors)
        report.errors.append(
            BatchError(
                code=ErrorCode.invalid_request.value,
                message=f"{left_out} more invalid line(s) not listed",
            )
        )
    return report


def file_endpoint(path: str | os.PathLike[str]) -> Endpoint:
    """A batch file's endpoint: the ``url`` of its first request line when that is one of
    the batch endpoints (validation then holds every line to it), else chat completions (a
    file whose first line names none is refused line by line against that)."""
    with open(path, "rb") as f:
        for _, raw in iter_lines(f):
            if raw is None or is_blank(raw):
                continue
            obj, _problem = parse_line(raw)
            url = obj.get("url") if obj is not None else None
            return Endpoint(url) if url in _ENDPOINT_URLS else Endpoint.chat_completions
    return Endpoint.chat_completions


_ENDPOINT_URLS = frozenset(e.value for e in Endpoint)


def iter_requests(stream: IO[bytes]) -> Iterator[RequestLine]:
    """The request lines of a file that passed :func:`validate_batch_file`, in file order."""
    seq = 0
    for number, raw in iter_lines(stream):
        if raw is None or is_blank(raw):
            continue
        obj, _ = parse_line(raw)
        if obj is None:  # cannot happen after validation; keep numbering in step anyway
            seq += 1
            continue
        yield RequestLine(seq=seq, line=number, custom_id=obj["custom_id"], body=obj["body"])
        seq += 1
