"""The cost ledger: a dry run of a few-shot batch for ``anthropic-batch`` says how much input the
prompt cache would read and write and, with ``--prices``, what that costs; the finished run's
usage is what the stand-in API reported, by class, and is costed the same way. Price tables are
the user's own JSON files, checked field by field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchclient import PriceTable
from batchclient._core.ledger import cost_of
from batchclient.cli import main
from batchclient.errors import ConfigurationError
from batchclient.testing import AnthropicBatchStub
from jobs_util import read_jsonl

KEY = "sk-ant-test"
pytestmark = pytest.mark.xdist_group("anthropic")

SYSTEM = "You grade arithmetic. " + " ".join(
    f"Rule {i}: an answer to question {i} must be a whole number." for i in range(600)
)
PRICES = {
    "as_of": "2026-12-01",
    "source": "example figures for the test, not a provider's",
    "currency": "USD",
    "models": {
        "claude-sonnet-4-5": {
            "batch": {"input": 1.5, "cached_input": 0.15, "cache_write": 3.0, "output": 7.5},
            "standard": {"input": 3.0, "output": 15.0},
        }
    },
}


def few_shot_file(path: Path, n: int) -> Path:
    lines = [
        {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "claude-sonnet-4-5-20250929", "max_tokens": 8, "messages": [
             {"role": "system", "content": SYSTEM},
             {"role": "user", "content": "What is 2 + 2?"},
             {"role": "assistant", "content": "4"},
             {"role": "user", "content": f"What is {i} + {i}?"}]}}
        for i in range(n)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def prices_file(tmp_path: Path, table: Any = None) -> Path:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(PRICES if table is None else table))
    return path


def test_a_dry_run_shows_cached_and_uncached_input_and_the_money(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = few_shot_file(tmp_path / "in.jsonl", 1000)
    args = ["run", str(inp), "--dry-run", "--provider", "anthropic-batch", "--api-key", KEY,
            "--state-dir", str(tmp_path / "s"), "--prices", str(prices_file(tmp_path))]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "of which cached" in x)
    numbers = [int(w.replace(",", "")) for w in line.split() if w.replace(",", "").isdigit()]
    cached, written, uncached = numbers
    prompt = next(x for x in out.splitlines() if x.startswith("prompt tokens:"))
    total = int(prompt.split()[2].replace(",", ""))
    assert cached + written + uncached == total
    assert written > 6000 and cached == 999 * written  # one write, 999 reads of the prefix
    assert "(batch tier)" in line
    cost = next(x for x in out.splitlines() if x.startswith("cost (USD)"))
    assert "prices of 2026-12-01" in cost and "claude-sonnet-4-5-20250929, batch" in cost
    expected = (uncached * 1.5 + cached * 0.15 + written * 3.0 + 1000 * 8 * 7.5) / 1e6
    assert f"{expected:,.4f}" in cost


def test_a_finished_run_reports_what_the_api_billed_by_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp, out = few_shot_file(tmp_path / "in.jsonl", 12), tmp_path / "out.jsonl"
    args = ["run", str(inp), "-o", str(out), "--provider", "anthropic-batch", "--api-key", KEY,
            "--poll-interval", "0.02", "--state-dir", str(tmp_path / "s"), "--no-progress",
            "--prices", str(prices_file(tmp_path))]  # fmt: skip
    with AnthropicBatchStub(api_key=KEY) as stub:
        assert main([*args, "--base-url", stub.url]) == 0
    usages = [r["response"]["body"]["usage"] for r in read_jsonl(out)]
    billed = {
        "input": sum(u["prompt_tokens"] for u in usages),
        "cached": sum(u.get("prompt_tokens_details", {}).get("cached_tokens", 0) for u in usages),
        "written": sum(u.get("cache_creation_input_tokens", 0) for u in usages),
        "output": sum(u["completion_tokens"] for u in usages),
    }
    assert billed["written"] > 0 and billed["cached"] == 11 * billed["written"]
    text = capsys.readouterr().out
    assert (
        f"input {billed['input']:,} of which {billed['cached']:,} read from the prompt cache "
        f"and {billed['written']:,} written to it" in text
    )
    table = PriceTable.model_validate(PRICES)
    cost = cost_of(
        table, "claude-sonnet-4-5-20250929", "batch",
        input_tokens=billed["input"], cached_tokens=billed["cached"],
        cache_write_tokens=billed["written"], output_tokens=billed["output"],
    )  # fmt: skip
    assert cost is not None and f"prices of 2026-12-01): {cost.total:,.4f}" in text


def test_costs_by_class_and_the_longest_matching_model() -> None:
    table = PriceTable.model_validate(
        {**PRICES, "models": {**PRICES["models"], "claude": {"batch": {"input": 9, "output": 9}}}}  # type: ignore[dict-item]
    )
    cost = cost_of(
        table, "claude-sonnet-4-5-20250929", "batch", input_tokens=1_000_000,
        cached_tokens=500_000, cache_write_tokens=100_000, output_tokens=200_000,
    )  # fmt: skip
    assert cost is not None
    assert (cost.input, cost.cached_input, cost.cache_write, cost.output) == pytest.approx(
        (0.4 * 1.5, 0.5 * 0.15, 0.1 * 3.0, 0.2 * 7.5)
    )
    standard = cost_of(table, "claude-sonnet-4-5", "standard", input_tokens=10, cached_tokens=10)
    assert standard is not None and standard.cached_input == pytest.approx(10 * 3.0 / 1e6)
    assert cost_of(table, "claude-haiku-4-5", "batch", input_tokens=1) is not None  # "claude"
    assert cost_of(table, "gpt-5", "batch", input_tokens=1) is None
    assert cost_of(table, "claude-sonnet-4-5", "flex", input_tokens=1) is None


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not JSON"),
        (json.dumps({"models": {}}), "as_of"),
        (json.dumps({**PRICES, "models": {"m": {"batch": {"input": -1, "output": 1}}}}), "input"),
        (json.dumps({**PRICES, "models": {"m": {"weekly": {"input": 1, "output": 1}}}}), "weekly"),
    ],
)
def test_a_bad_price_table_is_refused_with_the_field(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "prices.json"
    path.write_text(content)
    with pytest.raises(ConfigurationError, match=problem):
        PriceTable.load(path)
    with pytest.raises(ConfigurationError, match="prices"):
        PriceTable.load(tmp_path / "missing.json")
