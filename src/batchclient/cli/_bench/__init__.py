"""The benchmark harness behind ``batchclient bench`` (guide: ``docs/benchmarks.md``).

The original experiment, every mode on identical requests in one run: ``sequential`` (one
request at a time against the server, the "without batching" baseline), ``remote``
(:class:`~batchclient.RemoteBatchInference` fan-out, optionally a concurrency sweep), ``inline``
(:class:`~batchclient.VLLMBatchInference`), ``vllm-offline`` (raw ``vllm.LLM.chat``, the
ceiling reference) and the peer clients ``openai-gather`` and ``litellm`` on the same server.

Modules: ``_spec`` (the data passed between processes), ``_data`` (ShareGPT or JSONL
requests), ``_client_modes`` and ``_engine_modes`` (one function per mode), ``_child`` (one run
in a fresh process), ``_stats`` (rates, percentiles, ratios, targets), ``_report`` (Markdown,
JSON, chart, doc block), ``_args`` (the options), ``_run`` (the run). It lives in the package,
not in ``bench/``, so the installed ``batchclient bench`` works from any directory;
``bench/bench.py`` is a thin script over it, next to the other benchmarks.
"""

from __future__ import annotations

from ._args import add_arguments
from ._run import bench_command

__all__ = ["add_arguments", "bench_command"]
