"""What the harness passes around: the requests, one mode run's instructions and its figures.

All of it is plain JSON-able data (dataclasses of str/int/float/list) because each run crosses a
process boundary: the parent writes a :class:`RunSpec` file, a child process runs the mode and
writes a :class:`RunFigures` file back.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVER_MODES = ("sequential", "remote", "openai-gather", "litellm")
"""Modes that send requests to the OpenAI-compatible server."""
ENGINE_MODES = ("inline", "vllm-offline", "vllm-defaults", "ray")
"""Modes that run vLLM engines in their own process (the server is stopped meanwhile)."""
ALL_MODES = (
    "sequential",
    "remote",
    "inline",
    "vllm-offline",
    "vllm-defaults",
    "ray",
    "openai-gather",
    "litellm",
)
"""Every mode, in report order."""
UNBOUND_MODES = ("vllm-defaults", "ray")
"""Modes whose child does not get the harness's thread binding: ``vllm-defaults`` keeps vLLM's
own (``auto``), ``ray`` lets each replica bind its own cores."""

ENGINE_MAX_NUM_SEQS = 256
"""Sequences per engine step: vLLM's offline (``LLM`` class) default on CPU, given to the server
the harness starts too, so every mode runs the same scheduler (the server's own CPU default is
128 sequences and 2,048 tokens per step)."""
ENGINE_MAX_NUM_BATCHED_TOKENS = 4096
"""Tokens per engine step: vLLM's offline default on CPU (see :data:`ENGINE_MAX_NUM_SEQS`)."""
KV_CACHE_GIB = 2
"""Default KV cache of every engine the harness starts (server, inline, vllm-offline), in GiB
(``--kv-cache-gib``)."""


@dataclass(frozen=True)
class BenchRequest:
    """One conversation to generate for: ``max_tokens`` is the exact output length every mode
    asks for (``ignore_eos`` keeps generation going to it)."""

    custom_id: str
    messages: list[dict[str, Any]]
    max_tokens: int


@dataclass
class RunSpec:
    """Everything a child process needs to run one mode once."""

    mode: str
    requests_file: str
    result_file: str
    model_name: str
    model_path: str = ""
    base_url: str = ""
    concurrency: int = 1
    max_model_len: int = 2048
    kv_cache_gib: int = KV_CACHE_GIB
    warmup: bool = True
    replicas: int = 1

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self)), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> RunSpec:
        return cls(**json.loads(path.read_text(encoding="utf-8")))


@dataclass
class RequestFigures:
    """Per-request figures a mode collected (None where the mode does not expose one)."""

    prompt_tokens: int = 0
    output_tokens: int = 0
    latency_s: float | None = None
    ttft_s: float | None = None
    error: str | None = None


@dataclass
class RunFigures:
    """One run of one mode. Token counts are the sums of what the server or engine reported
    (``usage`` or token ids) over the requests that succeeded; ``expected_output_tokens`` is the
    sum of their ``max_tokens`` (equal to ``output_tokens`` when ``ignore_eos`` was honoured)."""

    requests: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    expected_output_tokens: int = 0
    wall_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    ttfts_s: list[float] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    errors: list[str] = field(default_factory=list)
    """The first few per-request error messages (all failures are counted in ``failed``)."""

    @classmethod
    def collect(
        cls, requests: list[BenchRequest], items: list[RequestFigures], wall_s: float
    ) -> RunFigures:
        ok = [(r, i) for r, i in zip(requests, items, strict=True) if i.error is None]
        failures = [i.error for i in items if i.error is not None]
        return cls(
            requests=len(requests),
            failed=len(failures),
            prompt_tokens=sum(i.prompt_tokens for _, i in ok),
            output_tokens=sum(i.output_tokens for _, i in ok),
            expected_output_tokens=sum(r.max_tokens for r, _ in ok),
            wall_s=wall_s,
            latencies_s=[i.latency_s for _, i in ok if i.latency_s is not None],
            ttfts_s=[i.ttft_s for _, i in ok if i.ttft_s is not None],
            errors=failures[:5],
        )


def save_requests(requests: list[BenchRequest], path: Path) -> None:
    path.write_text(json.dumps([dataclasses.asdict(r) for r in requests]), encoding="utf-8")


def load_requests(path: Path) -> list[BenchRequest]:
    return [BenchRequest(**r) for r in json.loads(path.read_text(encoding="utf-8"))]
