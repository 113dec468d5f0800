"""Benchmark of the inline provider: ``VLLMBatchInference`` against raw
``vllm.LLM.chat`` and one conversation at a time, plus memory at 5,000 conversations.

    python bench/inline.py     # 30-60 min on 2 CPU cores; writes bench/results/inline.json
    python bench/inline.py --rss-only --out bench/results/inline_rss.json   # memory only

Every mode runs in a fresh subprocess (its own engine, nothing shared) on identical requests:
``-n`` ShareGPT conversations (``batchclient.datasets.sample_sharegpt``, fixed seed), greedy,
``max_tokens`` = the reference reply's length capped at ``--cap``, and ``ignore_eos`` so every
mode generates exactly the same number of tokens. Engine arguments are the same everywhere
(bundled SmolLM2-135M, ``max_model_len`` 2048, eager mode, a 2 GiB KV cache), and each mode
warms its engine up with a few short requests before the clock starts.

Modes:
- ``llm_chat``: ``vllm.LLM.chat(conversations, sampling_params)``, the raw engine;
- ``inline``: ``VLLMBatchInference.batch_chat_completion`` on the same conversations; also
  records the event loop's longest stall (a task that asks to wake every 5 ms);
- ``one_at_a_time``: the first ``--single`` conversations through the same client, one call
  per conversation (no batching);
- ``rss_small`` / ``rss_big``: peak RSS during one ``batch_chat_completion`` over ``--n`` and
  ``--big`` conversations with ``max_tokens`` = ``--big-max-tokens`` (short: the 5,000 call is
  prefill-bound, 10-35 min on 2 CPU cores), sampled every 0.1 s, of the calling process
  (``peak_rss_mb``, the goal's figure) and of the whole process tree including the engine's
  processes (``peak_tree_rss_mb``); ``lifetime_peak_rss_mb`` is ``ru_maxrss``.

Targets: inline / llm_chat >= 1.00 (floor 0.95); inline / one_at_a_time >= 10;
RSS(big) - RSS(small) <= 300 MB. The figures are only as quiet as the machine: on a shared
machine they are noisy, so re-run on a quiet one before quoting them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "inline.json"
ENGINE_ARGS: dict[str, Any] = {
    "max_model_len": 2048,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 2 << 30,
}
# Short and long prompts (not among the measured ones): the first large prefill on CPU pays
# one-off kernel set-up that would otherwise land in whichever mode runs it first.
WARMUP: list[list[Any]] = [
    [{"role": "user", "content": f"Warm up {i}." + " word" * (300 * i)}] for i in range(4)
]


def _samples(n: int, seed: int, cap: int) -> list[Any]:
    from batchclient.datasets import sample_sharegpt

    return sample_sharegpt(n, seed=seed, max_output_tokens=cap)


class RssSampler:
    """Samples, every ``interval_s``, the RSS of this process (``peak_self``) and of this
    process with all its descendants, the engine's processes included (``peak_tree``)."""

    def __init__(self, interval_s: float = 0.1) -> None:
        import psutil

        self._psutil = psutil
        self.peak_self = 0
        self.peak_tree = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        me = self._psutil.Process()
        while not self._stop.wait(interval_s):
            mine = me.memory_info().rss
            total = mine
            for proc in me.children(recursive=True):
                with contextlib.suppress(self._psutil.Error):
                    total += proc.memory_info().rss
            self.peak_self = max(self.peak_self, mine)
            self.peak_tree = max(self.peak_tree, total)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _self_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


# ---------------------------------------------------------------------------- modes (children)


def mode_llm_chat(args: argparse.Namespace) -> dict[str, Any]:
    from vllm import LLM
    from vllm import SamplingParams as VllmSamplingParams

    from batchclient.models import bundled_model_path

    samples = _samples(args.n, args.seed, args.cap)
    llm = LLM(model=str(bundled_model_path()), **ENGINE_ARGS)
    greedy = VllmSamplingParams(max_tokens=4, temperature=0)
    llm.chat(WARMUP, greedy, use_tqdm=False)
    params = [
        VllmSamplingParams(max_tokens=s.output_tokens, temperature=0, ignore_eos=True)
        for s in samples
    ]
    started = time.perf_counter()
    outputs = llm.chat([s.messages for s in samples], params, use_tqdm=False)
    wall = time.perf_counter() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"requests": len(samples), "output_tokens": tokens, "wall_s": wall}


async def _loop_lag(stop: Any, record: list[float]) -> None:
    import anyio

    while not stop.is_set():
        asked = time.perf_counter()
        await anyio.sleep(0.005)
        record.append(time.perf_counter() - asked - 0.005)


async def _inline(args: argparse.Namespace) -> dict[str, Any]:
    import anyio

    from batchclient import SamplingParams, VLLMBatchInference

    samples = _samples(args.n, args.seed, args.cap)
    conversations = [s.messages for s in samples]
    params = [SamplingParams(max_tokens=s.output_tokens, ignore_eos=True) for s in samples]
    out: dict[str, Any] = {}
    async with VLLMBatchInference(**ENGINE_ARGS) as client:
        await client.batch_chat_completion(
            "smollm2", WARMUP, sampling_params=SamplingParams(max_tokens=4)
        )
        lags: list[float] = []
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_loop_lag, stop, lags)
            started = time.perf_counter()
            result = await client.batch_chat_completion(
                "smollm2", conversations, sampling_params=params
            )
            wall = time.perf_counter() - started
            stop.set()
        tokens = sum(int(r.metric("completion_tokens") or 0) for r in result.batch)
        ttfts = sorted(r.metric("time_to_first_token") or 0.0 for r in result.batch)
        out["inline"] = {
            "requests": len(samples),
            "failed": len(result.errors),
            "output_tokens": tokens,
            "wall_s": wall,
            "max_loop_stall_ms": 1000 * max(lags, default=0.0),
            "median_ttft_s": ttfts[len(ttfts) // 2] if ttfts else None,
        }
        single_tokens = 0
        started = time.perf_counter()
        for conversation, p in zip(
            conversations[: args.single], params[: args.single], strict=True
        ):
            one = await client.batch_chat_completion("smollm2", [conversation], sampling_params=p)
            single_tokens += int(one.batch[0].metric("completion_tokens") or 0)
        out["one_at_a_time"] = {
            "requests": min(args.single, len(samples)),
            "output_tokens": single_tokens,
            "wall_s": time.perf_counter() - started,
        }
    return out


def mode_inline(args: argparse.Namespace) -> dict[str, Any]:
    import anyio

    return anyio.run(_inline, args)


async def _rss(args: argparse.Namespace) -> dict[str, Any]:
    from batchclient import SamplingParams, VLLMBatchInference

    samples = _samples(args.rss_n, args.seed, args.cap)
    conversations = [s.messages for s in samples]
    async with VLLMBatchInference(**ENGINE_ARGS) as client:
        await client.batch_chat_completion(
            "smollm2", WARMUP, sampling_params=SamplingParams(max_tokens=4)
        )
        import psutil

        before_mb = psutil.Process().memory_info().rss / 2**20
        lifetime_before_mb = _self_peak_mb()
        sampler = RssSampler()
        started = time.perf_counter()
        result = await client.batch_chat_completion(
            "smollm2",
            conversations,
            sampling_params=SamplingParams(max_tokens=args.big_max_tokens, ignore_eos=True),
        )
        wall = time.perf_counter() - started
        sampler.stop()
    return {
        "requests": len(samples),
        "failed": len(result.errors),
        "wall_s": wall,
        "rss_mb_before_call": before_mb,
        "peak_rss_mb": sampler.peak_self / 2**20,  # sampled during the call
        "lifetime_peak_rss_mb_before_call": lifetime_before_mb,
        "lifetime_peak_rss_mb": _self_peak_mb(),  # ru_maxrss: includes engine start-up
        "peak_tree_rss_mb": sampler.peak_tree / 2**20,
    }


def mode_rss(args: argparse.Namespace) -> dict[str, Any]:
    import anyio

    return anyio.run(_rss, args)


MODES = {"llm_chat": mode_llm_chat, "inline": mode_inline, "rss": mode_rss}


# ---------------------------------------------------------------------------- the parent


def _child(mode: str, args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--mode", mode, "-n", str(args.n), "--seed", str(args.seed)]
    cmd += ["--cap", str(args.cap), "--single", str(args.single)]
    cmd += ["--big-max-tokens", str(args.big_max_tokens)]
    for key, value in extra.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    env = {**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
    print(f"[bench] {mode} {extra or ''} ...", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, check=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return dict(json.loads(lines[-1].removeprefix("RESULT ")))


def _rate(run: dict[str, Any]) -> float:
    return float(run["output_tokens"]) / float(run["wall_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=256, help="conversations (default 256)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cap", type=int, default=256, help="max output tokens per reply")
    parser.add_argument("--single", type=int, default=16, help="conversations run one at a time")
    parser.add_argument(
        "--big", type=int, default=5000, help="conversations of the RSS call (0: skip RSS runs)"
    )
    parser.add_argument("--big-max-tokens", type=int, default=4, help="max_tokens in RSS calls")
    parser.add_argument(
        "--rss-only",
        action="store_true",
        help="only the memory runs (throughput: `batchclient bench`, which has every mode)",
    )
    parser.add_argument("--mode", choices=sorted(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--rss-n", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.mode:
        print("RESULT " + json.dumps(MODES[args.mode](args)), flush=True)
        return

    started = time.time()
    ratios: dict[str, float] = {}
    goals: dict[str, bool] = {}
    llm_chat = inline = single = None
    if not args.rss_only:
        llm_chat = _child("llm_chat", args)
        inline_runs = _child("inline", args)
        inline, single = inline_runs["inline"], inline_runs["one_at_a_time"]
        for run in (llm_chat, inline, single):
            run["output_tokens_per_s"] = _rate(run)
        ratios["inline_over_llm_chat"] = (
            inline["output_tokens_per_s"] / llm_chat["output_tokens_per_s"]
        )
        ratios["inline_over_one_at_a_time"] = (
            inline["output_tokens_per_s"] / single["output_tokens_per_s"]
        )
        goals["inline_over_llm_chat >= 1.00 (floor 0.95)"] = ratios["inline_over_llm_chat"] >= 0.95
        goals["inline_over_one_at_a_time >= 10"] = ratios["inline_over_one_at_a_time"] >= 10
    small = big = None
    if args.big:  # --big 0 skips the memory runs
        small = _child("rss", args, rss_n=args.n)
        big = _child("rss", args, rss_n=args.big)
        ratios["rss_big_minus_small_mb"] = big["peak_rss_mb"] - small["peak_rss_mb"]
        ratios["tree_rss_big_minus_small_mb"] = big["peak_tree_rss_mb"] - small["peak_tree_rss_mb"]
        goals["rss_big_minus_small_mb <= 300"] = ratios["rss_big_minus_small_mb"] <= 300
    report: dict[str, Any] = {
        "command": "python bench/inline.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "note": "one run; on a shared machine the figures are noisy",
        "requests": {"n": args.n, "seed": args.seed, "max_tokens_cap": args.cap},
        "engine_args": ENGINE_ARGS,
        "llm_chat": llm_chat,
        "inline": inline,
        "one_at_a_time": single,
        "rss_small": small,
        "rss_big": big,
        "ratios": ratios,
        "goals_met": goals,
        "total_s": time.time() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for name in ("llm_chat", "inline", "one_at_a_time") if inline else ():
        run = report[name]
        print(
            f"{name:<14} {run['requests']:>5} req {run['output_tokens']:>7} tok "
            f"{run['wall_s']:8.1f} s {run['output_tokens_per_s']:8.1f} tok/s"
        )
    for name in ("rss_small", "rss_big") if small else ():
        run = report[name]
        print(
            f"{name:<14} {run['requests']:>5} req peak RSS {run['peak_rss_mb']:7.0f} MB "
            f"(tree {run['peak_tree_rss_mb']:6.0f} MB) {run['wall_s']:7.1f} s"
        )
    for key, value in ratios.items():
        print(f"{key:<32} {value:8.2f}")
    if inline:
        print(f"max event-loop stall during the inline call: {inline['max_loop_stall_ms']:.1f} ms")
    print(f"goals met: {goals}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
