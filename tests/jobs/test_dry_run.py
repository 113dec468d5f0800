"""Dry runs (``client.estimate``, ``batchclient run --dry-run``): validation, requests, merged
lines, cache hits, prompt tokens (the model's tokenizer or a labelled estimate), max output
tokens and cost, with nothing sent (against the loopback stub; the inline provider without an
engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from batchclient import RemoteBatchInference
from batchclient.cli import main
from batchclient.inline import VLLMProvider
from batchclient.jobs._estimate import estimate_file
from batchclient.models import bundled_model_path
from batchclient.testing import StubServer
from jobs_util import FAST, jsonl, line


def client(stub: StubServer, state: Path, **kw: Any) -> RemoteBatchInference:
    return RemoteBatchInference(stub.url, state_dir=state, **{**FAST, **kw})


def sample_lines() -> list[str]:
    lines = [line(f"g{i}", f"greedy {i % 4}", temperature=0, max_tokens=10) for i in range(12)]
    lines += [line(f"s{i}", "sampled", temperature=1.0, max_tokens=20) for i in range(3)]
    no_cap = json.loads(line("u0", "no cap"))
    del no_cap["body"]["max_tokens"]
    return [*lines, json.dumps(no_cap)]


async def test_estimate_counts_and_prices_and_sends_nothing(tmp_path: Path) -> None:
    with StubServer() as stub:
        async with client(stub, tmp_path) as c:
            record = await c.files.create(jsonl(sample_lines()))
            est = await c.estimate(record.id, price_input=2.0, price_output=10.0)
            assert stub.stats.requests == 0 and await c.batches.list() == []
    assert est.ok and est.requests == 16
    assert est.merged == 8 and est.to_send == 4 + 3 + 1  # sampled lines are never merged
    assert not est.cache and est.cache_hits == 0
    assert est.max_output_tokens == 4 * 10 + 3 * 20 and est.without_max_tokens == 1
    assert est.prompt_tokens_estimated and est.tokenizer is None
    # "greedy N" is 8 characters: 2 tokens + 3 per message + 3 for the reply
    assert est.prompt_tokens == 4 * 8 + 3 * (2 + 6) + (2 + 6)
    assert est.input_cost_usd == pytest.approx(est.prompt_tokens * 2.0 / 1e6)
    assert est.output_cost_usd == pytest.approx(100 * 10.0 / 1e6)
    assert est.cost_usd == pytest.approx((est.input_cost_usd or 0) + (est.output_cost_usd or 0))


async def test_estimate_with_the_cache_counts_the_hits_a_run_would_have(tmp_path: Path) -> None:
    lines = [line(f"r{i}", f"q{i}", temperature=0) for i in range(10)]
    with StubServer() as stub:
        async with client(stub, tmp_path, cache=True) as c:
            half = await c.files.create(jsonl(lines[:6]))
            await c.batches.wait((await c.batches.create(half.id)).id)
            record = await c.files.create(jsonl(lines))
            est = await c.estimate(record.id)
            off = await c.estimate(record.id, cache=False)
            batch = await c.batches.wait((await c.batches.create(record.id)).id)
        assert stub.stats.requests == 10
    assert est.cache and est.cache_hits == 6 and est.to_send == 4
    assert not off.cache and off.to_send == 10
    assert batch.cache_hits == est.cache_hits  # the run agrees with its estimate


async def test_estimate_of_a_refused_file_lists_its_errors(tmp_path: Path) -> None:
    with StubServer() as stub:
        async with client(stub, tmp_path) as c:
            record = await c.files.create(jsonl([line("a", "x"), "{oops", line("a", "y")]))
            est = await c.estimate(record.id)
    assert not est.ok and [(e.code, e.line) for e in est.errors] == [
        ("invalid_json_line", 2),
        ("duplicate_custom_id", 3),
    ]


@pytest.mark.slow
def test_prompt_tokens_with_the_model_tokenizer_match_it(tmp_path: Path) -> None:
    """The bundled model's tokenizer and chat template, as the server and engine count."""
    from providers import prompt_tokens

    path = tmp_path / "in.jsonl"
    texts = ["What is the capital of France?", "Écris un haïku sur la mer.", "x" * 300]
    path.write_bytes(jsonl([line(f"r{i}", t) for i, t in enumerate(texts)]))
    model_dir = str(bundled_model_path())
    est = anyio.run(lambda: estimate_file(path, None, None, tokenizer=model_dir))
    expected = sum(prompt_tokens([{"role": "user", "content": t}]) for t in texts)
    assert not est.prompt_tokens_estimated and est.tokenizer == model_dir
    assert est.prompt_tokens == expected
    # the inline provider offers its model's tokenizer, without starting an engine
    provider = VLLMProvider()
    est = anyio.run(lambda: estimate_file(path, provider, None))
    assert est.tokenizer == model_dir and est.prompt_tokens == expected


def test_cli_dry_run_prints_the_estimate_and_creates_no_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp, state = tmp_path / "in.jsonl", tmp_path / "state"
    inp.write_bytes(jsonl(sample_lines()))
    with StubServer() as stub:
        args = ["run", str(inp), "--dry-run", "--base-url", stub.url, "--state-dir", str(state)]
        assert main([*args, "--price-input", "0.15", "--price-output", "0.6"]) == 0
        assert stub.stats.requests == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "dry run: nothing was sent"
    assert "16 lines; 8 to send (8 identical greedy lines merged; result cache off" in out[1]
    assert "estimated, about 4 characters per token" in out[2]
    assert out[3].endswith(", 0 written to it, 64 uncached (standard tier)")  # no shared prefix
    assert "max output tokens: 100 (1 without max_tokens" in out[4]
    assert out[5].startswith("cost:              $0.0001 at most")
    assert not state.exists()  # nothing uploaded, no database
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(jsonl([line("a", "x"), "[1]"]))
    assert main(["run", str(bad), "--dry-run", "--base-url", "http://127.0.0.1:9/v1"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "refused (1 error(s))" in lines[0] and "line 2: invalid_json_line" in lines[1]


def test_cli_run_without_output_or_dry_run_is_a_usage_error(tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([line("a", "x")]))
    assert main(["run", str(inp), "--base-url", "http://127.0.0.1:9/v1"]) == 2


def completion_line(cid: str, prompt: Any, **body: Any) -> str:
    return json.dumps(
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "smollm2", "prompt": prompt, "max_tokens": 5, **body},
        }
    )


def embedding_line(cid: str, value: Any) -> str:
    return json.dumps(
        {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "smollm2", "input": value},
        }
    )


def words(n: int, seed: int) -> str:
    return " ".join(f"word{(seed * 7919 + i) % 1000}" for i in range(n))


async def test_estimate_of_completions_and_embeddings_files_counts_their_prompts(
    tmp_path: Path,
) -> None:
    """The endpoint is the file's own (its lines' ``url``); prompts and inputs are counted
    whatever their form (text, a list of texts, token ids)."""
    short = [completion_line(f"c{i}", words(1000, i)) for i in range(3)]
    long = [completion_line(f"c{i}", words(2000, i)) for i in range(3)]
    mixed = [
        completion_line("t", [1, 2, 3, 4]),
        completion_line("l", ["a" * 40, "b" * 40]),
        embedding_line("x", "y"),
    ]
    embed = [
        embedding_line("e0", words(500, 0)),
        embedding_line("e1", [words(500, 1), words(500, 2)]),
        embedding_line("e2", list(range(300))),
    ]
    with StubServer() as stub:
        async with client(stub, tmp_path) as c:
            ests = []
            for lines in (short, long, embed, mixed):
                record = await c.files.create(jsonl(lines))
                ests.append(await c.estimate(record.id))
        assert stub.stats.requests == 0
    short_est, long_est, embed_est, mixed_est = ests
    assert short_est.ok and long_est.ok and embed_est.ok, (short_est.errors, embed_est.errors)
    assert short_est.requests == 3 and short_est.max_output_tokens == 15
    assert short_est.prompt_tokens > 3 * 1000  # each "wordNNN" is several tokens
    assert long_est.prompt_tokens > 1.8 * short_est.prompt_tokens
    assert embed_est.prompt_tokens > 1000 + 300 and embed_est.without_max_tokens == 3
    # one endpoint per file: the embeddings line in a completions file is refused, by value
    assert not mixed_est.ok and mixed_est.errors[0].line == 3
    assert "'/v1/completions'" in mixed_est.errors[0].message
    assert "Endpoint." not in mixed_est.errors[0].message


@pytest.mark.slow
def test_prompt_tokens_of_completions_with_the_model_tokenizer(tmp_path: Path) -> None:
    """With a tokenizer a text prompt is its tokens (special tokens as a server adds them),
    token ids count one each, and a list of texts is the sum of its texts."""
    from providers import tokenizer

    tok = tokenizer()
    texts = ["The capital of France is", "x" * 300]
    path = tmp_path / "in.jsonl"
    path.write_bytes(
        jsonl(
            [
                completion_line("a", texts[0]),
                completion_line("b", texts),
                completion_line("c", [5, 6, 7]),
            ]
        )
    )
    est = anyio.run(lambda: estimate_file(path, None, None, tokenizer=str(bundled_model_path())))
    one, two = (len(ids) for ids in tok(texts).input_ids)
    assert not est.prompt_tokens_estimated
    assert est.prompt_tokens == one + (one + two) + 3


def test_cli_dry_run_of_a_completions_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(jsonl([completion_line(f"c{i}", words(2000, i)) for i in range(3)]))
    assert main(["run", str(inp), "--dry-run", "--base-url", "http://127.0.0.1:9/v1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "dry run: nothing was sent"
    tokens = int(out[2].split()[2].replace(",", ""))
    assert tokens > 3 * 2000
