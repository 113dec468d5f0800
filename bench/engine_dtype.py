"""The inline engine's default dtype against explicit ones, on this machine.

    python bench/engine_dtype.py [--runs default float32 bfloat16 float32 default]

Each run is its own process with one ``VLLMBatchInference`` on the bundled model: 4 warm-up
conversations, then 64 conversations of up to 64 output tokens; it prints one JSON line of
output tokens/s. Interleave the dtypes (the default list does) and quote the CPU's flags
(``grep -o -w -E 'avx512_bf16|amx_bf16|avx2' /proc/cpuinfo | sort -u``) with the figures: the
default is bfloat16 only where the CPU has bfloat16 arithmetic.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import anyio

from batchclient import SamplingParams, VLLMBatchInference


async def one_run(dtype: str) -> None:
    conversations = [
        [{"role": "user", "content": f"Tell me a long story about topic number {i}."}]
        for i in range(64)
    ]
    options = {} if dtype == "default" else {"dtype": dtype}
    async with VLLMBatchInference(**options) as client:  # type: ignore[arg-type]
        warm = SamplingParams(max_tokens=8)
        await client.batch_chat_completion("smollm2", conversations[:4], sampling_params=warm)
        start = time.perf_counter()
        result = await client.batch_chat_completion(
            "smollm2", conversations, sampling_params=SamplingParams(max_tokens=64)
        )
        seconds = time.perf_counter() - start
    tokens = sum(item.metric("completion_tokens") or 0 for item in result.batch)
    chosen = client.provider.dtype
    print(json.dumps({"dtype": dtype, "engine_dtype": chosen, "output_tok_s": tokens / seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", nargs="+", default=["default", "float32", "bfloat16", "float32"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        anyio.run(one_run, args.child)
        return
    for dtype in args.runs:
        out = subprocess.run(
            [sys.executable, __file__, "--child", dtype], capture_output=True, text=True
        )
        lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
        print(lines[-1] if lines else f'{{"dtype": "{dtype}", "error": {out.returncode}}}')


if __name__ == "__main__":
    main()
