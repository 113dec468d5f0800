"""A shared-prefix multiple-choice lm-eval task, generated: every question is asked after the
same five worked examples, so every request of the task shares a long prefix.

:func:`write_task` writes the data (``questions`` questions about unit conversions and
arithmetic over a fixed fictional inventory, four choices, ``answer`` index, in
``<task>.jsonl``; the five shots in ``<task>_shots.jsonl``) and the task YAML into a folder for
``--include_path`` / ``TaskManager(include_path=...)``, in one of two variants:

- ``numbers`` (task ``batchclient_prefix_mc``): the choices are the four numbers themselves,
  several tokens each for the bundled model's tokenizer (one per digit);
- ``letters`` (task ``batchclient_prefix_mc_letters``): MMLU's layout, the four numbers listed
  in the question as ``A.`` to ``D.`` and the choices ``A`` to ``D`` (continuations ``" A"`` to
  ``" D"``, one token each).

The shots come from the ``train`` split with lm-eval's ``first_n`` sampler, so all questions
share one prefix: a description and the five shots, over 400 tokens of the bundled model's
tokenizer (the test checks it). Deterministic for a given ``questions`` (seeded); both variants
ask the same questions.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Literal

PREFIX_MC_TASK = "batchclient_prefix_mc"
PREFIX_MC_LETTERS_TASK = "batchclient_prefix_mc_letters"
Variant = Literal["numbers", "letters"]
TASKS: dict[str, str] = {"numbers": PREFIX_MC_TASK, "letters": PREFIX_MC_LETTERS_TASK}
LETTERS = ["A", "B", "C", "D"]

DESCRIPTION = (
    "The warehouse of the Harbour Street Cooperative keeps the following stock, counted every "
    "morning by the night shift and checked again by the quartermaster before the doors open: "
    "crates of apples hold 24 apples each, crates of pears hold 18, sacks of flour weigh 25 "
    "kilograms, barrels of oil hold 160 litres, rolls of canvas are 12 metres long, boxes of "
    "nails hold 500 nails, bundles of rope are 30 metres, and pallets of bricks carry 240 "
    "bricks. Prices are given in crowns; a crown is 100 pennies. Answer each question with the "
    "number only, after working it out from the stock list above.\n\n"
)
LETTERS_DESCRIPTION = DESCRIPTION.replace(
    "with the number only", "with the letter of the right number only"
)

_ITEMS = [
    ("crates of apples", "apples", 24),
    ("crates of pears", "pears", 18),
    ("sacks of flour", "kilograms of flour", 25),
    ("barrels of oil", "litres of oil", 160),
    ("rolls of canvas", "metres of canvas", 12),
    ("boxes of nails", "nails", 500),
    ("bundles of rope", "metres of rope", 30),
    ("pallets of bricks", "bricks", 240),
]

_SHOT_PREAMBLE = (
    "A trader arrives at the loading dock with a written order from the mill across the river, "
    "signed by the miller and stamped by the harbour office, and the clerk must work out the "
    "total before the cart is loaded. "
)


def _question(rng: random.Random, long: bool, seen: set[tuple[str, int]]) -> dict[str, Any]:
    while True:  # no question twice
        unit, what, size = rng.choice(_ITEMS)
        count = rng.randint(2, 400)
        if (unit, count) not in seen:
            seen.add((unit, count))
            break
    answer = count * size
    wrong: set[int] = set()
    while len(wrong) < 3:
        delta = rng.choice([-2, -1, 1, 2, 3]) * rng.choice([1, size, 10])
        if answer + delta > 0 and answer + delta != answer:
            wrong.add(answer + delta)
    choices = [answer, *sorted(wrong)]
    rng.shuffle(choices)
    text = f"How many {what} are there in {count} {unit}?"
    if long:
        text = _SHOT_PREAMBLE + text
    return {
        "question": text,
        "choices": [str(c) for c in choices],
        "answer": choices.index(answer),
    }


def _lettered(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its choices listed in the question and answered by letter."""
    options = "".join(f"\n{k}. {c}" for k, c in zip(LETTERS, row["choices"], strict=True))
    return {"question": row["question"] + options, "choices": LETTERS, "answer": row["answer"]}


def rows(
    questions: int = 500, seed: int = 0, variant: Variant = "numbers"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(shots, questions)``: the five worked examples and ``questions`` test questions."""
    rng = random.Random(seed)
    seen: set[tuple[str, int]] = set()
    shots = [_question(rng, True, seen) for _ in range(5)]
    test = [_question(rng, False, seen) for _ in range(questions)]
    if variant == "letters":
        return [_lettered(r) for r in shots], [_lettered(r) for r in test]
    return shots, test


_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    train: {data}/{task}_shots.jsonl
    test: {data}/{task}.jsonl
training_split: train
test_split: test
fewshot_split: train
num_fewshot: 5
fewshot_config:
  sampler: first_n
description: {description}
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def write_task(
    folder: Path, questions: int = 500, seed: int = 0, variant: Variant = "numbers"
) -> Path:
    """Write the data and the task YAML of ``variant`` (its task name: ``TASKS[variant]``)
    into ``folder``; returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    shots, test = rows(questions, seed, variant)
    task = TASKS[variant]
    for name, data in ((f"{task}_shots.jsonl", shots), (f"{task}.jsonl", test)):
        with open(folder / name, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in data)
    description = LETTERS_DESCRIPTION if variant == "letters" else DESCRIPTION
    text = _YAML.format(task=task, data=folder.resolve(), description=json.dumps(description))
    (folder / f"{task}.yaml").write_text(text, encoding="utf-8")
    return folder
