"""The batch-file validator: OpenAI's codes, physical line numbers, ``param``; blank lines, CRLF,
encodings; duplicate ``custom_id``, non-requests, mixed models; and property tests that
arbitrary bytes never crash it."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchclient.jobs import validate_batch_file


def line(cid: str, text: str = "hi", **body: Any) -> str:
    return json.dumps(
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": body.pop("model", "smollm2"),
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 16,
                **body,
            },
        }
    )


def validate(data: bytes | str) -> Any:
    raw = data.encode() if isinstance(data, str) else data
    return validate_batch_file(io.BytesIO(raw))


def codes(report: Any) -> list[tuple[str, int | None, str | None]]:
    return [(e.code, e.line, e.param) for e in report.errors]


def test_valid_file() -> None:
    report = validate("\n".join(line(f"r{i}") for i in range(5)) + "\n")
    assert report.ok and report.total == 5 and report.model == "smollm2" and report.errors == []


def test_duplicate_custom_id_names_the_line() -> None:
    report = validate("\n".join([line("a"), line("b"), line("a")]))
    assert codes(report) == [("duplicate_custom_id", 3, "custom_id")]
    assert "line 1" in report.errors[0].message


def test_lines_no_request_can_carry_are_refused_by_line_not_as_a_crash() -> None:
    """A lone surrogate escape (valid JSON syntax, no character: it cannot be encoded to send)
    and an integer outside 64 bits (no API takes one; the JSON encoder refuses it) failed the
    whole batch with ``internal_error``, or the item with one. A surrogate pair is fine."""
    lone = line("b", "x\ud800y")  # json.dumps writes the escape
    assert "\\ud800y" in lone
    report = validate(
        "\n".join([line("a"), lone, line("c", max_tokens=2**64), line("d", seed=-(2**63) - 1)])
    )
    assert codes(report) == [
        ("invalid_json_line", 2, None),
        ("invalid_request", 3, None),
        ("invalid_request", 4, None),
    ]
    assert "lone surrogate" in report.errors[0].message
    assert str(2**64) in report.errors[1].message
    pair = line("f", "\U0001f642")  # written as the escapes \ud83d\ude42
    assert validate("\n".join([line("e", seed=2**63 - 1), pair])).ok


def test_blank_and_whitespace_lines_are_skipped_but_keep_physical_numbers() -> None:
    text = line("a") + "\n\n   \t \n" + line("b") + "\n\n"
    report = validate(text)
    assert report.ok and report.total == 2
    report = validate(line("a") + "\n\n  \n{not json\n")
    assert codes(report) == [("invalid_json_line", 4, None)]
    assert report.total == 2


def test_only_blank_lines_is_an_empty_file() -> None:
    for text in ("", "\n\n", "  \n\t\n \r\n"):
        assert codes(validate(text)) == [("empty_file", None, None)]


def test_crlf_and_utf8_bom_are_tolerated() -> None:
    report = validate(b"\xef\xbb\xbf" + (line("a") + "\r\n" + line("b") + "\r\n").encode())
    assert report.ok and report.total == 2


def test_json_that_is_not_a_request() -> None:
    no_method = json.loads(line("c"))
    del no_method["method"]
    body_string = json.loads(line("d"))
    body_string["body"] = "hello"
    embeddings = json.loads(line("e"))
    embeddings["url"] = "/v1/embeddings"
    lines = [line("a"), "[1,2,3]", json.dumps(no_method), json.dumps(body_string)]
    report = validate("\n".join([*lines, json.dumps(embeddings)]))
    assert codes(report) == [
        ("invalid_json_line", 2, None),
        ("missing_required_parameter", 3, "method"),
        ("invalid_request", 4, "body"),
        ("invalid_url", 5, "url"),
    ]
    assert report.total == 5


def test_missing_model_messages_and_bad_messages() -> None:
    no_model = json.loads(line("a"))
    del no_model["body"]["model"]
    no_messages = json.loads(line("b"))
    del no_messages["body"]["messages"]
    bad_messages = json.loads(line("c"))
    bad_messages["body"]["messages"] = [{"content": "no role"}]
    report = validate("\n".join(json.dumps(x) for x in (no_model, no_messages, bad_messages)))
    assert codes(report) == [
        ("missing_required_parameter", 1, "body.model"),
        ("missing_required_parameter", 2, "body.messages"),
        ("invalid_request", 3, "body.messages"),
    ]


def test_one_model_per_file() -> None:
    report = validate(
        "\n".join([line("a"), line("b", model="other-model"), line("c", model="no-such-model")])
    )
    assert codes(report) == [
        ("mismatched_model", 2, "body.model"),
        ("mismatched_model", 3, "body.model"),
    ]
    assert "'other-model'" in report.errors[0].message and "'smollm2'" in report.errors[0].message


def test_stream_is_refused_naming_the_field() -> None:
    report = validate("\n".join([line("a"), line("b", stream=True)]))
    assert codes(report) == [("streaming_unsupported", 2, "body.stream")]
    assert validate(line("a", stream=False)).ok


def test_utf16_file_is_refused_naming_the_encoding() -> None:
    report = validate((line("a") + "\n").encode("utf-16"))
    assert codes(report) == [("invalid_encoding", 1, None)]
    assert "UTF-16" in report.errors[0].message and "UTF-8" in report.errors[0].message


@pytest.mark.parametrize(
    ("codec", "bom", "named"),
    [
        ("utf-16-le", b"", "UTF-16 (little-endian, no BOM)"),
        ("utf-16-be", b"", "UTF-16 (big-endian, no BOM)"),
        ("utf-32-le", b"", "UTF-32 (little-endian, no BOM)"),
        ("utf-32-be", b"", "UTF-32 (big-endian, no BOM)"),
        ("utf-16-le", b"\xff\xfe", "UTF-16 (little-endian, with BOM)"),
        ("utf-16-be", b"\xfe\xff", "UTF-16 (big-endian, with BOM)"),
        ("utf-32-le", b"\xff\xfe\x00\x00", "UTF-32 (little-endian, with BOM)"),
        ("utf-32-be", b"\x00\x00\xfe\xff", "UTF-32 (big-endian, with BOM)"),
    ],
)
def test_utf16_and_utf32_files_are_refused_once_naming_the_encoding(
    codec: str, bom: bytes, named: str
) -> None:
    text = "\n".join(line(f"r{i}", "caf\u00e9 \u6771\u4eac") for i in range(50)) + "\n"
    report = validate(bom + text.encode(codec))
    assert codes(report) == [("invalid_encoding", 1, None)]  # one error, not one per line
    assert named in report.errors[0].message and "not UTF-8" in report.errors[0].message
    assert "iconv -f UTF-" in report.errors[0].message


def test_a_utf8_file_mostly_in_another_script_is_not_taken_for_utf16() -> None:
    text = "\n".join(line(f"r{i}", "\u6771\u4eac\u90fd" * 40) for i in range(5))
    assert validate(text.encode()).ok


def test_latin1_line_is_refused_naming_the_encoding() -> None:
    report = validate(
        line("a").encode()
        + b"\n"
        + line("b", "cafe").replace("cafe", "caf\u00e9").encode("latin-1")
    )
    assert codes(report) == [("invalid_encoding", 2, None)]
    assert "Latin-1" in report.errors[0].message and "UTF-8" in report.errors[0].message


def test_deeply_nested_json_is_an_error_not_a_crash() -> None:
    report = validate("[" * 100_000 + "]" * 100_000)
    assert codes(report) == [("invalid_json_line", 1, None)]


def test_error_list_is_capped_with_a_summary() -> None:
    report = validate("x\n" * 1500)
    assert report.error_count == 1500
    assert len(report.errors) == 1001
    assert "500 more" in report.errors[-1].message


# -------------------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    report = validate(data)
    physical = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    assert report.total <= physical
    for error in report.errors:
        assert error.code and error.message
        assert error.line is None or 1 <= error.line <= max(physical, 1)
    assert report.ok == (report.error_count == 0)


_good = st.builds(lambda i: line(f"id-{i}"), st.integers(0, 10**9))
_bad = st.sampled_from(
    [
        "{",
        "[]",
        '"text"',
        json.dumps({"custom_id": "x"}),
        line("y", stream=True).replace('"POST"', '"GET"'),
        line("z").replace("/v1/chat/completions", "/v1/completions"),
    ]
)
_blank = st.sampled_from(["", " ", "\t", "  \r"])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["good", "bad", "blank"]), _good, _bad, _blank), max_size=30)
)
def test_errors_point_at_exactly_the_bad_lines(spec: list[tuple[str, str, str, str]]) -> None:
    lines, bad_lines, requests, seen = [], [], 0, set()
    for number, (kind, good, bad, blank) in enumerate(spec, start=1):
        if kind == "good" and good in seen:
            kind = "blank"  # keep custom ids unique; duplicates have their own test
        text = {"good": good, "bad": bad, "blank": blank}[kind]
        seen.add(good) if kind == "good" else None
        lines.append(text)
        requests += kind != "blank"
        if kind == "bad":
            bad_lines.append(number)
    report = validate("\r\n".join(lines))
    assert report.total == requests
    if requests == 0:
        assert codes(report) == [("empty_file", None, None)]
    else:
        assert [e.line for e in report.errors] == bad_lines


def test_every_batch_status_is_either_active_or_terminal() -> None:
    from batchclient import BatchStatus

    assert set(BatchStatus) == BatchStatus.ACTIVE | BatchStatus.TERMINAL
    assert not BatchStatus.ACTIVE & BatchStatus.TERMINAL
    assert [s for s in BatchStatus if s.terminal] == [
        BatchStatus.completed,
        BatchStatus.failed,
        BatchStatus.cancelled,
        BatchStatus.expired,
    ]
    assert all(s.active != s.terminal for s in BatchStatus)
    assert "completed" in BatchStatus.TERMINAL and "cancelling" in BatchStatus.ACTIVE
