"""Output tokens/s of the remote fan-out at several in-flight limits, against one real vLLM
server with the bundled model, on identical ShareGPT requests, in one run.

    python bench/remote_sweep.py [-n 128] [--max-concurrency 1 8 64] [--max-tokens 128]
        [--base-url URL] [--repeat 1]

Without ``--base-url`` it starts the local vLLM server itself. Concurrency 1 runs only the first
``--sequential`` conversations (one at a time is slow); its tokens/s is still comparable.
Writes ``bench/results/remote_sweep.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time
from pathlib import Path

import anyio

from batchclient import RemoteBatchInference, SamplingParams
from batchclient.datasets import SharegptSample, sample_sharegpt
from batchclient.testing import vllm_server


async def run_once(
    url: str, samples: list[SharegptSample], concurrency: int, cap: int
) -> dict[str, float]:
    params = [SamplingParams(max_tokens=min(s.output_tokens, cap)) for s in samples]
    async with RemoteBatchInference(url, max_concurrency=concurrency) as client:
        started = time.perf_counter()
        result = await client.batch_chat_completion(
            "smollm2", [s.messages for s in samples], sampling_params=params
        )
        wall = time.perf_counter() - started
    tokens = sum(int(r.metric("completion_tokens") or 0) for r in result.batch)
    return {
        "requests": len(samples),
        "failed": len(result.errors),
        "output_tokens": tokens,
        "wall_s": wall,
        "output_tokens_per_s": tokens / wall,
    }


async def main(args: argparse.Namespace) -> None:
    samples = sample_sharegpt(args.n, seed=args.seed)
    with contextlib.ExitStack() as stack:
        url = args.base_url or stack.enter_context(vllm_server())
        # warm-up: the first requests after start-up are slower
        await run_once(url, samples[:8], 8, 16)
        rows = []
        for concurrency in args.max_concurrency:
            subset = samples if concurrency > 1 else samples[: args.sequential]
            runs = [
                await run_once(url, subset, concurrency, args.max_tokens)
                for _ in range(args.repeat)
            ]
            median = statistics.median(r["output_tokens_per_s"] for r in runs)
            rows.append(
                {"concurrency": concurrency, "runs": runs, "median_output_tokens_per_s": median}
            )
            print(
                f"in flight {concurrency:>3}: {runs[-1]['requests']:>4} requests, "
                f"{median:7.1f} output tok/s (median of {len(runs)}), "
                f"failed {runs[-1]['failed']}",
                flush=True,
            )
    base = rows[0]["median_output_tokens_per_s"]
    for row in rows:
        row["speedup_vs_first"] = row["median_output_tokens_per_s"] / base if base else None
    out = Path(__file__).parent / "results" / "remote_sweep.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "command": "python bench/remote_sweep.py " + " ".join(args.argv),
                "machine": {
                    "cpu": platform.processor() or platform.machine(),
                    "python": platform.python_version(),
                },
                "n": args.n,
                "max_tokens_cap": args.max_tokens,
                "rows": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    import sys

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--sequential", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--base-url", default=None)
    ns = parser.parse_args()
    ns.argv = sys.argv[1:]
    anyio.run(main, ns)
