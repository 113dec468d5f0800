"""Eval throughput: log-likelihood requests/s against lm-eval's own backends, and embeddings/s.

Log-likelihood: the local multiple-choice task (``tests/evals/mc.jsonl``, 48 questions x 4
choices) repeated ``--copies`` times (each copy's contexts prefixed ``[k]`` so no two requests
are the same: 1,920 requests for 10 copies), timed around lm-eval's ``LM.loglikelihood`` call,
after a warm-up, with every answer cache off:

- ``ll-inline``: batchclient's ``BatchClientLM`` on its own vLLM engine, vs ``ll-vllm``:
  lm-eval's ``vllm`` backend (``batch_size=auto``: all requests in one ``LLM.generate``);
- ``ll-remote``: ``BatchClientLM`` over the remote provider (64 in flight), vs
  ``ll-local-completions``: lm-eval's ``local-completions`` (``num_concurrent=64``), both on the
  same vLLM server with the bundled tokenizer.

Embeddings: 1,000 ShareGPT prompts (vLLM's benchmark sampling, seed 0) through
``batch_embeddings`` on an inline pooling engine (``emb-inline``) and on a vLLM server in
pooling mode with 64 in flight (``emb-remote``), once per ``--group-sizes`` value (inputs per
``/v1/embeddings`` request, ``embedding_group_size``; default 16), each against the same server.

Each mode runs in its own process; engines and servers run one at a time, with the same
512 MiB KV cache and ``max_model_len`` 2048. The answers are compared too: the largest
log-likelihood difference between each pair, and the smallest cosine between the two
providers' embeddings of each prompt.

    python bench/evals.py [--copies 10] [--embeddings 1000] [--group-sizes 16] [--repeat 1]
        [--modes ...]

With ``--repeat N`` each log-likelihood mode runs N times (interleaved with its pair) and its
row is the run with the median requests/s; every run's rate is kept beside it.

Writes ``bench/results/evals.json``. Needs the vLLM lock on a shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the local task's definition and data

KV_BYTES = 512 << 20
MAX_MODEL_LEN = 2048
WARMUP = 16
LL_MODES = ("ll-inline", "ll-vllm", "ll-remote", "ll-local-completions")
EMB_MODES = ("emb-inline", "emb-remote")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


# ------------------------------------------------------------------------------ children


def _instances(copies: int) -> list[Any]:
    from lm_eval.api.instance import Instance
    from lm_eval.tasks import TaskManager, get_task_dict

    from lm_eval_tasks import MC_TASK, write_tasks

    folder = write_tasks(Path(tempfile.mkdtemp(prefix="bench-evals-")))
    task = get_task_dict([MC_TASK], TaskManager(include_path=str(folder)))[MC_TASK]
    task.build_all_requests(limit=None, rank=0, world_size=1)
    base = [i.args for i in task.instances]
    return [
        Instance("loglikelihood", {}, (f"[{k}] {ctx}", cont), n)
        for k in range(copies)
        for n, (ctx, cont) in enumerate(base)
    ]


def _model(mode: str, base_url: str | None) -> Any:
    from batchclient.integrations.lm_eval import BatchClientLM, fix_vllm_version_lookup
    from batchclient.models import bundled_model_path

    bundled = str(bundled_model_path())
    if mode == "ll-inline":
        return BatchClientLM(
            provider="vllm",
            cache=False,
            kv_cache_memory_bytes=KV_BYTES,
            max_model_len=MAX_MODEL_LEN,
        )
    if mode == "ll-remote":
        return BatchClientLM(
            provider="remote", base_url=base_url, model="smollm2", tokenizer=bundled,
            max_concurrency=64, cache=False,
        )  # fmt: skip
    if mode == "ll-vllm":
        fix_vllm_version_lookup()
        from lm_eval.models.vllm_causallms import VLLM

        return VLLM(
            pretrained=bundled, max_model_len=MAX_MODEL_LEN, enforce_eager=True,
            batch_size="auto", kv_cache_memory_bytes=KV_BYTES,
        )  # fmt: skip
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    return LocalCompletionsAPI(
        base_url=f"{base_url}/completions", model="smollm2", tokenizer=bundled,
        tokenizer_backend="huggingface", num_concurrent=64, max_retries=3,
    )  # fmt: skip


def child_loglikelihood(mode: str, copies: int, base_url: str | None) -> dict[str, Any]:
    instances = _instances(copies)
    model = _model(mode, base_url)
    model.loglikelihood(_instances(1)[:WARMUP], disable_tqdm=True)
    started = time.perf_counter()
    scores = model.loglikelihood(instances, disable_tqdm=True)
    seconds = time.perf_counter() - started
    if hasattr(model, "close"):
        model.close()
    return {
        "requests": len(instances),
        "seconds": seconds,
        "requests_per_s": len(instances) / seconds,
        "logprobs": [float(s[0]) for s in scores],
    }


def child_embeddings(
    mode: str, n: int, base_url: str | None, vectors_out: str, group: int
) -> dict[str, Any]:
    import anyio

    from batchclient import RemoteBatchInference, VLLMBatchInference
    from batchclient.datasets import sample_sharegpt

    prompts = [s.prompt for s in sample_sharegpt(n, seed=0)]

    async def run() -> dict[str, Any]:
        client: Any
        if mode == "emb-inline":
            client = VLLMBatchInference(
                runner="pooling", convert="embed", max_model_len=MAX_MODEL_LEN,
                kv_cache_memory_bytes=KV_BYTES,
            )  # fmt: skip
        else:
            assert base_url is not None
            client = RemoteBatchInference(base_url, max_concurrency=64, embedding_group_size=group)
        async with client:
            await client.batch_embeddings("smollm2", prompts[:WARMUP])
            started = time.perf_counter()
            got = await client.batch_embeddings("smollm2", prompts)
            seconds = time.perf_counter() - started
        await anyio.Path(vectors_out).write_text(json.dumps(got.embeddings))
        return {
            "inputs": len(prompts),
            "failed": len(got.errors),
            "seconds": seconds,
            "embeddings_per_s": len(prompts) / seconds,
            **({"group_size": group} if mode == "emb-remote" else {}),
        }

    return anyio.run(run)


# ------------------------------------------------------------------------------ parent


def _spawn(args: list[str]) -> dict[str, Any]:
    """One mode in a child process: its figures, or ``{"error": ...}`` (the other modes go on).

    The child writes its figures to a file and its output to a log, not to pipes: an engine
    process it leaves behind would hold a pipe open. It runs in a session of its own, killed
    whole once the child is done, so no engine outlives its mode."""
    env = {**os.environ, **OFFLINE, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'tests'}"}
    with tempfile.TemporaryDirectory(prefix="bench-evals-child-") as tmp:
        result, log = Path(tmp) / "result.json", Path(tmp) / "child.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, __file__, *args, "--result", str(result)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                code = proc.wait(timeout=3600)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        tail = log.read_text(errors="replace")[-3000:]
        if code != 0 or not result.exists():
            print(f"{args[1]} failed (exit {code}):\n{tail}", file=sys.stderr)
            return {"error": f"exit {code}: {tail[-500:]}"}
        figures = dict(json.loads(result.read_text()))
    print(f"{args[1]}: {json.dumps({k: v for k, v in figures.items() if k != 'logprobs'})}")
    return figures


def _median_run(tries: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median requests/s (the lower middle one of an even count), with every
    run's rate and the largest difference between its runs' answers beside it; the first
    error when no run succeeded."""
    ok = sorted((t for t in tries if "error" not in t), key=lambda t: t["requests_per_s"])
    if not ok:
        return tries[0]
    median = dict(ok[(len(ok) - 1) // 2])
    median["runs_requests_per_s"] = [t.get("requests_per_s") for t in tries]
    if len(ok) > 1:  # how far the same mode's answers move from run to run
        median["max_abs_logprob_diff_between_runs"] = max(_max_diff(ok[0], t) for t in ok[1:])
    return median


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    return float(max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"], strict=True)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--copies", type=int, default=10, help="copies of the local task (default 10)")
    p.add_argument("--embeddings", type=int, default=1000, help="ShareGPT prompts (default 1000)")
    p.add_argument(
        "--group-sizes", type=int, nargs="+", default=[16],
        help="emb-remote: inputs per /v1/embeddings request, one run each (default 16)",
    )  # fmt: skip
    p.add_argument("--modes", nargs="+", default=[*LL_MODES, *EMB_MODES])
    p.add_argument(
        "--repeat", type=int, default=1, help="runs of each log-likelihood mode, median kept (1)"
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "evals.json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--base-url", help=argparse.SUPPRESS)
    p.add_argument("--vectors", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        if args.child in LL_MODES:
            out = child_loglikelihood(args.child, args.copies, args.base_url)
        else:
            out = child_embeddings(
                args.child, args.embeddings, args.base_url, args.vectors, args.group_sizes[0]
            )
        Path(args.result).write_text(json.dumps(out))
        sys.stdout.flush()
        sys.stderr.flush()
        # skip interpreter teardown: lm-eval's vLLM engine can abort there ("terminate called
        # without an active exception"); the parent ends what is left of the child's session
        os._exit(0)

    from batchclient.testing import vllm_server

    runs: dict[str, dict[str, Any]] = {}
    copies = ["--copies", str(args.copies)]
    tries: dict[str, list[dict[str, Any]]] = {m: [] for m in LL_MODES}
    for _ in range(args.repeat):  # interleaved, so drift of the machine hits both sides
        for mode in ("ll-inline", "ll-vllm"):
            if mode in args.modes:
                tries[mode].append(_spawn(["--child", mode, *copies]))
    if {"ll-remote", "ll-local-completions"} & set(args.modes):
        with vllm_server(max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=KV_BYTES) as url:
            for _ in range(args.repeat):
                for mode in ("ll-remote", "ll-local-completions"):
                    if mode in args.modes:
                        tries[mode].append(_spawn(["--child", mode, *copies, "--base-url", url]))
    for mode, done in tries.items():
        if done:
            runs[mode] = _median_run(done)
    vectors = {m: tempfile.mktemp(suffix=".json") for m in EMB_MODES}
    emb = ["--embeddings", str(args.embeddings)]
    if "emb-inline" in args.modes:
        runs["emb-inline"] = _spawn(
            ["--child", "emb-inline", *emb, "--vectors", vectors["emb-inline"]]
        )
    if "emb-remote" in args.modes:
        with vllm_server(
            max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=KV_BYTES, runner="pooling",
            convert="embed",
        ) as url:  # fmt: skip
            for k, size in enumerate(args.group_sizes):  # the first one's vectors are compared
                name = "emb-remote" if k == 0 else f"emb-remote-g{size}"
                runs[name] = _spawn(
                    [
                        "--child", "emb-remote", *emb, "--base-url", url,
                        "--vectors", vectors["emb-remote"] if k == 0 else os.devnull,
                        "--group-sizes", str(size),
                    ]
                )  # fmt: skip

    report: dict[str, Any] = {"copies": args.copies, "repeat": args.repeat, "modes": {}}
    for mode, figures in runs.items():
        report["modes"][mode] = {k: v for k, v in figures.items() if k != "logprobs"}
    ok = {m for m, f in runs.items() if "error" not in f}
    for ours, theirs in (("ll-inline", "ll-vllm"), ("ll-remote", "ll-local-completions")):
        if ours in ok and theirs in ok:
            report[f"{ours} / {theirs}"] = {
                "ratio": runs[ours]["requests_per_s"] / runs[theirs]["requests_per_s"],
                "max_abs_logprob_diff": _max_diff(runs[ours], runs[theirs]),
            }
    for mode in sorted(m for m in ok if m.startswith("emb-remote")):
        if "emb-inline" in ok:
            size = runs[mode]["group_size"]
            ratio = runs[mode]["embeddings_per_s"] / runs["emb-inline"]["embeddings_per_s"]
            report[f"emb-remote (group {size}) / emb-inline"] = ratio
    if all(m in ok for m in EMB_MODES):
        a, b = (json.loads(Path(vectors[m]).read_text()) for m in EMB_MODES)
        report["embeddings min cosine"] = min(_cosine(x, y) for x, y in zip(a, b, strict=True))
    report["machine"] = {"cpus": os.cpu_count(), "load_1m": os.getloadavg()[0]}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
