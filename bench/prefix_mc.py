"""Shared-prefix scoring: log-likelihood requests/s of batchclient inline against lm-eval's
``vllm`` backend on a task whose every question follows the same five shots.

The task is ``tests/prefix_mc_task.py``'s (500 questions x 4 choices = 2,000 requests after one
5-shot prefix of over 400 tokens), built by lm-eval from its YAML, in the variant ``--choices``
names: ``letters`` (default; MMLU's layout, the options listed in the question and the choices
``" A"`` to ``" D"``, one token each) or ``numbers`` (the numbers themselves, 3-7 tokens each).
Each mode runs in its own
process, one after the other, on the same engine settings (float32, 512 MiB KV cache,
``max_model_len`` 2048, vLLM's prefix caching on), timed around ``LM.loglikelihood`` after a
warm-up of 8 requests:

- ``ll-inline``: ``BatchClientLM(provider="vllm")`` (one-token continuations scored by a
  generation request that reads the prefix cache; ``--no-single-token-scoring`` turns that off);
- ``ll-vllm``: lm-eval's ``vllm`` backend (``batch_size=auto``: one ``LLM.generate``).

With ``--ray`` the two modes are instead ``BatchClientLM(provider="ray", replicas=2)`` with
prefix affinity (``ll-ray-affinity``) and without (``ll-ray-no-affinity``), each replica with
the settings above and half the cores; the ratio is with ÷ without, written to
``prefix_mc_<choices>_ray.json``.

Prints each mode's requests/s, their ratio, and the largest difference between the two modes'
log-likelihoods, and whether both chose the same answer for every question; writes
``bench/results/prefix_mc_<choices>.json`` (``prefix_mc_<choices>_off.json`` with
``--no-single-token-scoring``). Needs the vLLM lock on a shared machine; on 2 idle cores the
500 questions take lm-eval's backend about 50 minutes, batchclient about 1 (``--ray``: about 6
in all):

    flock /tmp/bc-engine.lock python bench/prefix_mc.py [--choices letters|numbers]
        [--questions 500] [--no-single-token-scoring] [--ray]
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
MODES = ("ll-inline", "ll-vllm")
RAY_MODES = ("ll-ray-affinity", "ll-ray-no-affinity")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


def _instances(questions: int, choices: str) -> list[Any]:
    from lm_eval.tasks import TaskManager, get_task_dict

    from prefix_mc_task import TASKS, write_task

    folder = Path(tempfile.mkdtemp(prefix="bench-prefix-mc-"))
    write_task(folder, questions, variant=choices)  # type: ignore[arg-type]
    name = TASKS[choices]
    task = get_task_dict([name], TaskManager(include_path=str(folder)))[name]
    task.build_all_requests(limit=None, rank=0, world_size=1)
    return list(task.instances)


def _model(mode: str, single_token_scoring: bool) -> Any:
    from batchclient.integrations.lm_eval import BatchClientLM, fix_vllm_version_lookup
    from batchclient.models import bundled_model_path

    common: dict[str, Any] = {
        "max_model_len": MAX_MODEL_LEN, "kv_cache_memory_bytes": KV_BYTES, "dtype": "float32",
        "enable_prefix_caching": True,
    }  # fmt: skip
    if mode == "ll-inline":
        return BatchClientLM(
            provider="vllm", cache=False, single_token_scoring=single_token_scoring, **common
        )
    if mode in RAY_MODES:
        return BatchClientLM(
            provider="ray", cache=False, single_token_scoring=single_token_scoring,
            replicas=2, prefix_affinity=mode == "ll-ray-affinity", **common,
        )  # fmt: skip
    fix_vllm_version_lookup()
    from lm_eval.models.vllm_causallms import VLLM

    return VLLM(
        pretrained=str(bundled_model_path()), enforce_eager=True, batch_size="auto", **common
    )


def child(mode: str, questions: int, choices: str, single_token_scoring: bool) -> dict[str, Any]:
    instances = _instances(questions, choices)
    model = _model(mode, single_token_scoring)
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


def _spawn(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, **OFFLINE, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'tests'}"}
    with tempfile.TemporaryDirectory(prefix="bench-prefix-mc-child-") as tmp:
        out = Path(tmp) / "result.json"
        argv = [
            "--child", mode, "--questions", str(args.questions), "--choices", args.choices,
            "--result", str(out),
            *([] if args.single_token_scoring else ["--no-single-token-scoring"]),
        ]  # fmt: skip
        code = subprocess.call([sys.executable, __file__, *argv], env=env, timeout=3 * 3600)
        if code != 0 or not out.exists():
            return {"error": f"exit {code}"}
        return dict(json.loads(out.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=500)
    parser.add_argument("--choices", choices=["letters", "numbers"], default="letters")
    parser.add_argument(
        "--no-single-token-scoring", dest="single_token_scoring", action="store_false"
    )
    parser.add_argument(
        "--ray", action="store_true", help="Ray, 2 replicas, with and without prefix affinity"
    )
    parser.add_argument("--child")
    parser.add_argument("--result")
    args = parser.parse_args()
    if args.child:
        result = child(args.child, args.questions, args.choices, args.single_token_scoring)
        Path(args.result).write_text(json.dumps(result))
        return
    modes = RAY_MODES if args.ray else MODES
    runs = {mode: _spawn(mode, args) for mode in modes}
    first, second = (runs[mode] for mode in modes)
    summary: dict[str, Any] = {
        "choices": args.choices,
        "questions": args.questions,
        "single_token_scoring": args.single_token_scoring,
        "load_avg_at_end": os.getloadavg(),
        **{mode: {k: v for k, v in r.items() if k != "logprobs"} for mode, r in runs.items()},
    }
    if "error" not in first and "error" not in second:
        ours, theirs = first["logprobs"], second["logprobs"]
        summary["ratio"] = first["requests_per_s"] / second["requests_per_s"]
        summary["max_logprob_diff"] = max(abs(a - b) for a, b in zip(ours, theirs, strict=True))
        summary["same_answers"] = _answers(ours) == _answers(theirs)
    print(json.dumps(summary, indent=2))
    suffix = ("" if args.single_token_scoring else "_off") + ("_ray" if args.ray else "")
    name = f"prefix_mc_{args.choices}{suffix}.json"
    (ROOT / "bench" / "results" / name).write_text(json.dumps(summary, indent=2) + "\n")


def _answers(logprobs: list[float]) -> list[int]:
    """Each question's chosen choice (the highest log-likelihood of its four)."""
    groups = [logprobs[i : i + 4] for i in range(0, len(logprobs), 4)]
    return [group.index(max(group)) for group in groups]


if __name__ == "__main__":
    main()
