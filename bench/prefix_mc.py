"""Shared-prefix scoring: log-likelihood requests/s of batchclient inline against lm-eval's
``vllm`` backend on a task whose every question follows the same five shots.

The task is ``tests/prefix_mc_task.py``'s (500 questions x 4 choices = 2,000 requests after one
5-shot prefix of over 400 tokens), built by lm-eval from its YAML. Each mode runs in its own
process, one after the other, on the same engine settings (float32, 512 MiB KV cache,
``max_model_len`` 2048, vLLM's prefix caching on), timed around ``LM.loglikelihood`` after a
warm-up of 8 requests:

- ``ll-inline``: ``BatchClientLM(provider="vllm")``;
- ``ll-vllm``: lm-eval's ``vllm`` backend (``batch_size=auto``: one ``LLM.generate``).

Prints each mode's requests/s, their ratio, and the largest difference between the two modes'
log-likelihoods; writes ``bench/results/prefix_mc.json``. Needs the vLLM lock on a shared
machine (about 10 minutes on 2 cores):

    flock /tmp/bc-engine.lock python bench/prefix_mc.py [--questions 500]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the task's generator

KV_BYTES = 512 << 20
MAX_MODEL_LEN = 2048
WARMUP = 8
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


def _instances(questions: int) -> list[Any]:
    from lm_eval.tasks import TaskManager, get_task_dict

    from prefix_mc_task import PREFIX_MC_TASK, write_task

    folder = write_task(Path(tempfile.mkdtemp(prefix="bench-prefix-mc-")), questions)
    task = get_task_dict([PREFIX_MC_TASK], TaskManager(include_path=str(folder)))[PREFIX_MC_TASK]
    task.build_all_requests(limit=None, rank=0, world_size=1)
    return list(task.instances)


def _model(mode: str) -> Any:
    from batchclient.integrations.lm_eval import BatchClientLM, fix_vllm_version_lookup
    from batchclient.models import bundled_model_path

    common: dict[str, Any] = {
        "max_model_len": MAX_MODEL_LEN, "kv_cache_memory_bytes": KV_BYTES, "dtype": "float32",
        "enable_prefix_caching": True,
    }  # fmt: skip
    if mode == "ll-inline":
        return BatchClientLM(provider="vllm", cache=False, **common)
    fix_vllm_version_lookup()
    from lm_eval.models.vllm_causallms import VLLM

    return VLLM(
        pretrained=str(bundled_model_path()), enforce_eager=True, batch_size="auto", **common
    )


def child(mode: str, questions: int) -> dict[str, Any]:
    instances = _instances(questions)
    model = _model(mode)
    model.loglikelihood(instances[:WARMUP], disable_tqdm=True)
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


def _spawn(mode: str, questions: int) -> dict[str, Any]:
    env = {**os.environ, **OFFLINE, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'tests'}"}
    with tempfile.TemporaryDirectory(prefix="bench-prefix-mc-child-") as tmp:
        out = Path(tmp) / "result.json"
        args = ["--child", mode, "--questions", str(questions), "--result", str(out)]
        code = subprocess.call([sys.executable, __file__, *args], env=env, timeout=3600)
        if code != 0 or not out.exists():
            return {"error": f"exit {code}"}
        return dict(json.loads(out.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=500)
    parser.add_argument("--child")
    parser.add_argument("--result")
    args = parser.parse_args()
    if args.child:
        Path(args.result).write_text(json.dumps(child(args.child, args.questions)))
        return
    runs = {mode: _spawn(mode, args.questions) for mode in ("ll-inline", "ll-vllm")}
    inline, lm_eval = runs["ll-inline"], runs["ll-vllm"]
    summary: dict[str, Any] = {
        mode: {k: v for k, v in r.items() if k != "logprobs"} for mode, r in runs.items()
    }
    if "error" not in inline and "error" not in lm_eval:
        summary["ratio"] = inline["requests_per_s"] / lm_eval["requests_per_s"]
        summary["max_logprob_diff"] = max(
            abs(a - b) for a, b in zip(inline["logprobs"], lm_eval["logprobs"], strict=True)
        )
    print(json.dumps(summary, indent=2))
    (ROOT / "bench" / "results" / "prefix_mc.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
