"""The generated shared-prefix multiple-choice task, in both variants: lm-eval builds it
offline, every question gets the same five shots, and that shared prefix is over 400 tokens; the
letters variant's continuations are one token each, the numbers variant's several."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batchclient.models import bundled_model_path
from prefix_mc_task import LETTERS, TASKS, Variant, write_task


@pytest.mark.slow  # lm-eval's import and task building: about 20 s
@pytest.mark.parametrize("variant", ["numbers", "letters"])
def test_the_task_has_500_questions_of_4_choices_after_one_long_prefix(
    tmp_path: Path, variant: Variant
) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # imported here, not at collection: transformers (and torch with it) takes seconds to import
    from lm_eval.tasks import TaskManager, get_task_dict
    from transformers import AutoTokenizer

    folder = write_task(tmp_path, variant=variant)
    name = TASKS[variant]
    task = get_task_dict([name], TaskManager(include_path=str(folder)))[name]
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
    # continuation tokens as lm-eval (and batchclient) count them: the whole's after the context's
    lengths = {
        len(tokenizer.encode(ctx + cont)) - len(tokenizer.encode(ctx)) for ctx, cont in pairs[:200]
    }
    if variant == "letters":
        assert [cont for _, cont in pairs[:4]] == [f" {x}" for x in LETTERS]
        assert "\nA. " in contexts[0] and lengths == {1}
    else:
        assert min(lengths) > 1
