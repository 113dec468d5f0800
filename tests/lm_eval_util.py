"""Running an lm-eval evaluation on the local tasks and comparing two runs item by item."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Any

from lm_eval_tasks import GEN_TASK, MC_TASK, PPL_TASK, write_tasks

TASKS = [MC_TASK, GEN_TASK, PPL_TASK]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

Run = tuple[dict[str, Any], dict[str, dict[int, list[Any]]]]
"""(metrics by task, per task: doc_id -> that document's answers, one per request)."""


def offline() -> None:
    os.environ.update(OFFLINE)


def evaluate(model: Any, folder: Path, tasks: list[str] = TASKS) -> Run:
    """``simple_evaluate`` on the local tasks, with samples."""
    offline()
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    out = simple_evaluate(
        model=model,
        tasks=tasks,
        task_manager=TaskManager(include_path=str(write_tasks(folder))),
        log_samples=True,
    )
    assert out is not None
    samples = {
        task: {int(s["doc_id"]): [r[0] for r in s["resps"]] for s in rows}
        for task, rows in out["samples"].items()
    }
    return out["results"], samples


def read_output(folder: Path) -> Run:
    """A run that lm-eval's own command wrote with ``--log_samples --output_path folder``."""
    [results_file] = glob.glob(f"{folder}/**/results_*.json", recursive=True)
    results = json.loads(Path(results_file).read_text())["results"]
    samples: dict[str, dict[int, list[Any]]] = {}
    for path in glob.glob(f"{folder}/**/samples_*.jsonl", recursive=True):
        task = Path(path).name.removeprefix("samples_").rsplit("_", 1)[0]
        rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
        samples[task] = {int(s["doc_id"]): [r[0] for r in s["resps"]] for s in rows}
    return results, samples


def _number(value: Any) -> float:
    return float(value)  # --log_samples writes floats as strings


def assert_same_run(ours: Run, theirs: Run, *, tol: float = 1e-4) -> None:
    """Every log-likelihood within ``tol``, every greedy flag and generated text equal, every
    metric equal (within ``tol``)."""
    (our_metrics, our_samples), (their_metrics, their_samples) = ours, theirs
    assert set(our_samples) == set(their_samples)
    for task, docs in our_samples.items():
        assert docs.keys() == their_samples[task].keys(), task
        for doc_id, answers in docs.items():
            for mine, other in zip(answers, their_samples[task][doc_id], strict=True):
                if task == MC_TASK:
                    assert abs(_number(mine[0]) - _number(other[0])) <= tol, (task, doc_id)
                    assert str(mine[1]) == str(other[1]), (task, doc_id)
                elif task == PPL_TASK:
                    assert abs(_number(mine) - _number(other)) <= tol, (task, doc_id)
                else:
                    assert mine == other, (task, doc_id)
        for key, value in our_metrics[task].items():
            if "," in key and isinstance(value, int | float):
                assert abs(value - their_metrics[task][key]) <= tol, (task, key)
