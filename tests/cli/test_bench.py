"""The benchmark harness (``batchclient bench``) on tiny runs: figures present and consistent
(tokens add up, rates and ratios come from the same rows, JSON + PNG + Markdown written, the doc
block refreshed), never their values. Server modes run against the session server; the one
engine mode tested (inline) runs on the session engine, so no extra engine starts here."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from batchclient.cli import main
from batchclient.cli._bench import _args, _report, _run
from batchclient.cli._bench._data import jsonl_requests
from batchclient.cli._bench._engine_modes import run_inline
from batchclient.cli._bench._spec import BenchRequest, RunFigures, RunSpec
from batchclient.cli._bench._stats import ModeRow, add_ratios, percentile, run_row, targets
from batchclient.errors import ConfigurationError

HAS_LITELLM = importlib.util.find_spec("litellm") is not None


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, int]:
    code = main(["bench", *argv])
    return capsys.readouterr().out, code


def rows_by_label(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["label"]: row for row in report["rows"]}


def assert_row_consistent(row: dict[str, Any], requests: int, *, latency: bool = True) -> None:
    m = row["median"]
    assert m is not None, row
    assert m["requests"] == requests and m["failed"] == 0, m["errors"]
    # ignore_eos was honoured: every request generated exactly its max_tokens
    assert m["output_tokens"] == m["expected_output_tokens"] > 0
    assert m["total_tokens"] == m["prompt_tokens"] + m["output_tokens"]
    assert m["prompt_tokens"] > 0
    assert math.isclose(m["output_tokens_per_s"], m["output_tokens"] / m["wall_s"])
    assert math.isclose(m["total_tokens_per_s"], m["total_tokens"] / m["wall_s"])
    assert math.isclose(m["requests_per_s"], requests / m["wall_s"])
    if latency:
        assert m["latency_p50_s"] <= m["latency_p90_s"] <= m["latency_p99_s"]
    else:  # the mode exposes no per-request timings: shown as missing, never as zero
        assert m["latency_p50_s"] is None and m["ttft_p50_s"] is None
    assert m["peak_rss_mb"] > 0
    assert (
        m["output_tokens_per_s_runs"] and m["output_tokens_per_s"] in m["output_tokens_per_s_runs"]
    )


@pytest.mark.server
def test_bench_server_modes(
    vllm_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results"
    stdout, code = bench(
        capsys,
        "-n", "4", "--max-tokens", "4", "--sequential-n", "2",
        "--modes", "sequential", "remote", "openai-gather", "litellm",
        "--max-concurrency", "2", "4", "--no-warmup",
        "--base-url", vllm_url, "--out", str(out), "--name", "tiny",
    )  # fmt: skip
    assert code == 0
    report = json.loads((out / "tiny.json").read_text())
    assert (out / "tiny.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "tiny.md").read_text() == stdout.rstrip("\n") + "\n"

    rows = rows_by_label(report)
    assert list(rows) == ["sequential", "remote@2", "remote@4", "openai-gather@4", "litellm@4"]
    assert stdout.count("\n| ") == len(rows) + 1  # header + one line per row
    for label in rows:
        assert f"| {label} |" in stdout
    assert_row_consistent(rows["sequential"], 2)
    for label in ("remote@2", "remote@4", "openai-gather@4"):
        assert_row_consistent(rows[label], 4)
    if HAS_LITELLM:
        assert_row_consistent(rows["litellm@4"], 4)
    else:
        assert rows["litellm@4"]["skipped"].startswith("not installed")
    # same requests -> same token counts in every mode
    full = [rows[x]["median"] for x in ("remote@2", "remote@4", "openai-gather@4")]
    assert len({(m["prompt_tokens"], m["output_tokens"]) for m in full}) == 1
    assert report["data"]["max_tokens_sum"] == full[0]["output_tokens"]

    seq_rate = rows["sequential"]["median"]["output_tokens_per_s"]
    for row in rows.values():
        if row["median"] is not None:
            rate = row["median"]["output_tokens_per_s"]
            assert math.isclose(row["vs_sequential"], rate / seq_rate)
            assert row["vs_vllm_offline"] is None  # vllm-offline did not run
    by_name = {t["target"]: t for t in report["targets"]}
    remote_rate = rows["remote@4"]["median"]["output_tokens_per_s"]
    peer_rate = rows["openai-gather@4"]["median"]["output_tokens_per_s"]
    assert math.isclose(by_name["remote@4 >= openai-gather@4"]["value"], remote_rate / peer_rate)
    assert by_name["remote@4 >= 10 x sequential"]["value"] == rows["remote@4"]["vs_sequential"]

    env = report["environment"]
    assert env["versions"]["batchclient"] and env["versions"]["python"] and env["cpu_count"]
    assert env["model"] == "smollm2"
    assert report["command"].startswith("batchclient bench -n 4 --seed 0 --max-tokens 4")

    # the saved report renders again, into a doc block that is replaced, not appended
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nintro\n\n" + _report.DOC_BEGIN + "\nold\n" + _report.DOC_END
                   + "\n\noutro\n")  # fmt: skip
    for _ in range(2):
        again, code = bench(capsys, "--from-json", str(out / "tiny.json"), "--update-doc", str(doc))
        assert code == 0 and again == stdout
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n\n") and text.endswith("\n\noutro\n")
    assert text.count(_report.DOC_BEGIN) == 1 and "old" not in text
    assert "](results/tiny.png)" in text and "| remote@4 | 4 |" in text


@pytest.mark.server
def test_bench_jsonl_input(
    vllm_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        {"custom_id": "a", "body": {"messages": [{"role": "user", "content": "Hi"}],
                                    "max_tokens": 3}},
        {"custom_id": "b", "body": {"messages": [{"role": "user", "content": "Name a fruit."}]}},
        {"custom_id": "c", "body": {"messages": [{"role": "user", "content": "2+2?"}],
                                    "max_completion_tokens": 50}},
    ]  # fmt: skip
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    _, code = bench(
        capsys,
        "--input", str(inp), "--max-tokens", "5", "--modes", "remote", "--max-concurrency", "3",
        "--repeat", "3", "--base-url", vllm_url, "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    row = rows_by_label(report)["remote@3"]
    assert_row_consistent(row, 3)
    assert len(row["runs"]) == 3  # the row is the median run of the three
    assert (
        row["median"]["output_tokens_per_s"] == sorted(row["median"]["output_tokens_per_s_runs"])[1]
    )
    assert row["median"]["output_tokens"] == 3 + 5 + 5  # the line's max_tokens, capped
    assert report["data"]["seed"] is None and str(inp) in report["data"]["source"]


def test_jsonl_input_rejects_bad_lines(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"custom_id": "a", "body": {"messages": [{"role": "user", "content": "x"}]}}\n'
                   '{"custom_id": "b", "body": {"prompt": "no messages"}}\n')  # fmt: skip
    with pytest.raises(ConfigurationError, match=r"bad.jsonl:2: no body.messages"):
        jsonl_requests(bad, n=None, max_tokens=8)
    assert len(jsonl_requests(bad, n=1, max_tokens=8)) == 1  # -n stops before the bad line
    bad.write_text('{"body": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}}\n')
    with pytest.raises(ConfigurationError, match="max_tokens must be a positive integer"):
        jsonl_requests(bad, n=None, max_tokens=8)


def test_bench_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "-n", "0", "--modes", "remote"]) == 2
    assert "-n must be >= 1" in capsys.readouterr().err


@pytest.mark.server
@pytest.mark.engine
@pytest.mark.heavy
def test_bench_engine_mode_in_its_own_process(
    vllm_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vllm-offline through the CLI: its engine starts in a child process after the server
    modes, and the ratios and targets against it come from the same rows."""
    stdout, code = bench(
        capsys,
        "-n", "3", "--max-tokens", "4", "--modes", "remote", "vllm-offline",
        "--max-concurrency", "3", "--no-warmup", "--kv-cache-gib", "1",
        "--base-url", vllm_url, "--out", str(tmp_path), "--name", "engine",
    )  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "engine.json").read_text())
    assert (tmp_path / "engine.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = rows_by_label(report)
    assert list(rows) == ["remote@3", "vllm-offline"]
    assert "| remote@3 | 3 |" in stdout and "| vllm-offline | engine |" in stdout
    remote, offline = rows["remote@3"], rows["vllm-offline"]
    assert_row_consistent(remote, 3)
    assert_row_consistent(offline, 3, latency=False)
    # identical requests: the server's usage and the engine's token ids count the same tokens
    assert remote["median"]["prompt_tokens"] == offline["median"]["prompt_tokens"]
    assert remote["median"]["output_tokens"] == offline["median"]["output_tokens"]
    # the engine mode's RSS covers its engine processes (the model), not just the parent
    assert offline["median"]["peak_rss_mb"] > remote["median"]["peak_rss_mb"]
    assert offline["vs_vllm_offline"] == 1.0 and offline["vs_sequential"] is None
    ratio = remote["median"]["output_tokens_per_s"] / offline["median"]["output_tokens_per_s"]
    assert math.isclose(remote["vs_vllm_offline"], ratio)
    target = {t["target"]: t for t in report["targets"]}["remote@3 >= 0.90 x vllm-offline"]
    assert target["value"] == remote["vs_vllm_offline"] and target["met"] == (ratio >= 0.90)
    assert report["engine"]["kv_cache_gib"] == 1


@pytest.mark.engine
async def test_inline_mode_on_the_session_engine(inline_client: Any) -> None:
    requests = [
        BenchRequest(f"r{i}", [{"role": "user", "content": f"Count to {i}."}], 3 + i)
        for i in range(3)
    ]
    spec = RunSpec(mode="inline", requests_file="", result_file="", model_name="smollm2")
    items, wall = await run_inline(spec, requests, client=inline_client)
    figures = RunFigures.collect(requests, items, wall)
    assert figures.failed == 0 and figures.requests == 3
    assert [i.output_tokens for i in items] == [3, 4, 5]
    assert figures.output_tokens == figures.expected_output_tokens == 12
    assert all(i.prompt_tokens > 0 for i in items)
    # the inline engine exposes time to first token, and it comes before the answer
    assert all(i.ttft_s is not None and i.latency_s is not None for i in items)
    assert all(0 <= i.ttft_s <= i.latency_s <= wall for i in items)  # type: ignore[operator]


# ------------------------------------------------------------------ pure parts


def test_percentile_nearest_rank() -> None:
    values = [float(x) for x in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 90) == 3.0
    assert percentile([], 50) is None


def figures(output_tokens: int, wall_s: float) -> RunFigures:
    return RunFigures(
        requests=2, prompt_tokens=10, output_tokens=output_tokens,
        expected_output_tokens=output_tokens, wall_s=wall_s, latencies_s=[0.1, 0.2],
        peak_rss_mb=100.0,
    )  # fmt: skip


def test_median_run_ratios_and_targets() -> None:
    seq = ModeRow("sequential", "sequential", 1, runs=[run_row(figures(10, 1.0))])
    remote = ModeRow("remote@8", "remote", 8)
    remote.runs = [run_row(figures(100, w)) for w in (1.0, 0.5, 2.0)]  # 100, 200, 50 tok/s
    offline = ModeRow("vllm-offline", "vllm-offline", None, runs=[run_row(figures(200, 1.0))])
    peer = ModeRow("openai-gather@8", "openai-gather", 8, runs=[run_row(figures(400, 1.0))])
    skipped = ModeRow("litellm@8", "litellm", 8, skipped="not installed (pip install litellm)")
    rows = [seq, remote, offline, peer, skipped]
    for row in rows:
        row.finish()
    add_ratios(rows)
    assert remote.median is not None and remote.median["output_tokens_per_s"] == 100.0
    assert remote.median["wall_s"] == 1.0  # the median run's own figures, not mixed
    assert remote.vs_sequential == 10.0 and remote.vs_vllm_offline == 0.5
    assert skipped.median is None and skipped.vs_sequential is None
    got = {t["target"]: (t["value"], t["met"]) for t in targets(rows, 8)}
    assert got == {
        "remote@8 >= 0.90 x vllm-offline": (0.5, False),
        "remote@8 >= 10 x sequential": (10.0, True),
        "remote@8 >= openai-gather@8": (0.25, False),
    }
    report = {"rows": [r.to_json() for r in rows], "targets": targets(rows, 8)}
    text = _report.table(report)
    assert "| litellm@8 | 8 | not installed (pip install litellm) |" in text
    assert _report.targets_text(report).splitlines() == [
        "- remote@8 >= 0.90 x vllm-offline: not met (0.50 vs target 0.90)",
        "- remote@8 >= 10 x sequential: met (10.00 vs target 10.00)",
        "- remote@8 >= openai-gather@8: not met (0.25 vs target 1.00)",
    ]


def test_plan_marks_missing_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "litellm" else real(name)
    )
    parser = argparse.ArgumentParser()
    _args.add_arguments(parser)
    args = parser.parse_args(["--max-concurrency", "8", "64", "8"])
    rows = _run.plan(args)
    assert [r.label for r in rows] == [
        "sequential", "remote@8", "remote@64", "inline", "vllm-offline", "vllm-defaults",
        "ray-1", "ray-2", "openai-gather@64", "litellm@64",
    ]  # fmt: skip
    assert [r.replicas for r in rows if r.mode == "ray"] == [1, 2]
    assert [r.label for r in rows if r.skipped] == ["litellm@64"]


def test_engine_targets_compare_inline_with_each_engine_mode() -> None:
    def row(label: str, mode: str, tokens: int) -> ModeRow:
        made = ModeRow(label, mode, None, runs=[run_row(figures(tokens, 1.0))])
        made.finish()
        return made

    rows = [
        row("remote@256", "remote", 90),
        row("inline", "inline", 100),
        row("vllm-offline", "vllm-offline", 100),
        row("vllm-defaults", "vllm-defaults", 60),
        row("ray-1", "ray", 96),
        row("ray-2", "ray", 90),
    ]
    rows[0].concurrency = 256
    got = {t["target"]: (round(t["value"], 3), t["met"]) for t in targets(rows, 256)}
    assert got["inline >= 1.30 x vllm-defaults"] == (1.667, True)
    assert got["inline >= 1.00 x vllm-offline"] == (1.0, True)
    assert got["inline >= 1.05 x remote@256"] == (1.111, True)
    assert got["ray-1 >= 0.95 x inline"] == (0.96, True)
    assert got["ray-2 >= 0.95 x inline"] == (0.9, False)


def test_harness_binding_is_every_core_unless_the_caller_set_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3}, raising=False)
    assert _run.harness_binding() == "0-3"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")
    assert _run.harness_binding() == "1"  # the caller's choice stands


# ------------------------------------------------------------------------------ prefix cache


def _prefix_cache_hits(base_url: str) -> float:
    import httpx

    text = httpx.get(f"{base_url.removesuffix('/v1')}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:prefix_cache_hits_total")
    )


@pytest.mark.server
def test_the_harness_empties_the_servers_prefix_cache(vllm_url: str) -> None:
    """A prompt sent again hits vLLM's prefix cache; after the harness's reset it does not, so
    one server run cannot profit from the prompts of the run before it."""
    import httpx

    prompt = " ".join(f"word{i}" for i in range(300))  # about 900 tokens: several KV blocks
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 1}

    def send() -> float:
        answer = httpx.post(f"{vllm_url}/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        return _prefix_cache_hits(vllm_url)

    first = send()
    again = send()
    assert again > first  # the second time its blocks were cached
    _run._reset_prefix_cache(vllm_url)
    assert send() == again  # emptied: no hit


def test_a_refused_prefix_cache_reset_stops_the_harness() -> None:
    from batchclient.testing import StubServer

    with StubServer() as stub, pytest.raises(ConfigurationError, match="HTTP 404"):
        _run._reset_prefix_cache(stub.url)
