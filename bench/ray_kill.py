"""Kill one of two Ray replicas mid-batch: how many items are lost (target 0) and how much wall
time it costs.

    python bench/ray_kill.py [-n 128] [--max-tokens 64] [--kill-at 0.5]

Starts ``RayBatchInference(replicas=2)`` on a local Ray (each replica bound to its own core on a
2-core machine), runs the same ShareGPT requests twice: once undisturbed, once with replica 0
killed (``ray.kill``, no restart) after ``--kill-at`` of the first run's wall time. Writes
``bench/results/ray_kill.json``. Hold the machine's vLLM lock while it runs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import anyio


async def main(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from batchclient import RayBatchInference, SamplingParams
    from batchclient.cli._bench._data import sharegpt_requests

    requests = sharegpt_requests(args.n, seed=0, max_tokens=args.max_tokens)
    messages = [r.messages for r in requests]
    params = [SamplingParams(max_tokens=r.max_tokens, ignore_eos=True) for r in requests]
    async with RayBatchInference(
        replicas=2, kv_cache_memory_bytes=args.kv_cache_mib << 20, max_model_len=2048
    ) as client:
        await client.batch_chat_completion("smollm2", messages[:4], SamplingParams(max_tokens=4))
        started = time.perf_counter()
        calm = await client.batch_chat_completion("smollm2", messages, params)
        calm_wall = time.perf_counter() - started
        victim = client.provider.handles[0]

        async def kill() -> None:
            await anyio.sleep(calm_wall * args.kill_at)
            ray.kill(victim.actor, no_restart=True)

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(kill)
            hit = await client.batch_chat_completion("smollm2", messages, params)
        hit_wall = time.perf_counter() - started
    tokens = sum(r.max_tokens for r in requests)
    return {
        "command": f"python bench/ray_kill.py -n {args.n} --max-tokens {args.max_tokens} "
        f"--kill-at {args.kill_at}",
        "requests": args.n,
        "output_tokens": tokens,
        "undisturbed_wall_s": calm_wall,
        "undisturbed_failed": sum(1 for r in calm.batch if r.error),
        "killed_wall_s": hit_wall,
        "killed_after_s": calm_wall * args.kill_at,
        "items_lost": sum(1 for r in hit.batch if r.error),
        "extra_wall_s": hit_wall - calm_wall,
        "note": "one run each; on a shared machine the figures are noisy",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=128, help="requests (default 128)")
    parser.add_argument("--max-tokens", type=int, default=64, help="output cap (default 64)")
    parser.add_argument(
        "--kill-at", type=float, default=0.5, help="kill after this share of the wall time"
    )
    parser.add_argument("--kv-cache-mib", type=int, default=512, help="per replica (512)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/ray_kill.json"))
    parsed = parser.parse_args()
    report = anyio.run(main, parsed)
    parsed.out.parent.mkdir(parents=True, exist_ok=True)
    parsed.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))
