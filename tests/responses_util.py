"""Helpers of the Responses API tests: a batch file of ``/v1/responses`` lines in the three
forms users write, and its output lines read as the openai SDK's ``Response``."""

from __future__ import annotations

import json
from typing import Any

from openai.types.responses import Response

from jobs_util import jsonl


def responses_lines(n: int = 12, model: str = "smollm2", **settings: Any) -> bytes:
    """``n`` ``/v1/responses`` lines in three forms: text ``input``; message items with
    ``input_text`` parts; text with ``instructions``."""
    lines = []
    for i in range(n):
        question = f"question {i}"
        body: dict[str, Any] = {"model": model, "max_output_tokens": 16, **settings}
        if i % 3 == 0:
            body["input"] = question
        elif i % 3 == 1:
            parts = [
                {"type": "input_text", "text": "question"},
                {"type": "input_text", "text": f" {i}"},
            ]
            body["input"] = [{"type": "message", "role": "user", "content": parts}]
        else:
            body |= {"input": question, "instructions": "Answer in one word."}
        lines.append(
            json.dumps(
                {"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses", "body": body}
            )
        )
    return jsonl(lines)


def answers(lines: list[dict[str, Any]]) -> dict[str, str]:
    """custom_id -> the ``output_text`` of each output line, parsed as the SDK's ``Response``."""
    out = {}
    for row in lines:
        assert row["error"] is None and row["response"]["status_code"] == 200
        out[row["custom_id"]] = Response.model_validate(row["response"]["body"]).output_text
    return out


def expected(n: int = 12) -> dict[str, str]:
    # the stand-ins echo the last user turn; input_text parts joined as sent
    return {f"r{i}": f"echo: question {i}" for i in range(n)}
