"""The generated shared-prefix multiple-choice task: lm-eval builds it offline, every question
gets the same five shots, and that shared prefix is over 400 tokens."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from batchclient.models import bundled_model_path
from prefix_mc_task import PREFIX_MC_TASK, write_task


@pytest.mark.slow  # lm-eval's import and task building: about 20 s
def test_the_task_has_500_questions_of_4_choices_after_one_long_prefix(tmp_path: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lm_eval.tasks import TaskManager, get_task_dict

    folder = write_task(tmp_path)
    task = get_task_dict([PREFIX_MC_TASK], TaskManager(include_path=str(folder)))[PREFIX_MC_TASK]
    task.build_all_requests(limit=None, rank=0, world_size=1)
    pairs = [i.args for i in task.instances]
    contexts = [ctx for ctx, _ in pairs]
    assert len(pairs) == 4 * 500
    assert len(set(contexts)) == 500  # one context per question, its four choices share it
    last = contexts[0].rindex("Question:")
    prefix = contexts[0][:last]
    assert all(ctx.startswith(prefix) for ctx in contexts)  # one shared few-shot prefix
    assert prefix.count("Question:") == 5
    tokenizer = AutoTokenizer.from_pretrained(str(bundled_model_path()))
    assert len(tokenizer.encode(prefix)) >= 400
