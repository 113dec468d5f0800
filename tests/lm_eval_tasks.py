"""The local lm-eval tasks the eval tests and the benchmark use, written next to their data.

Data (shipped in ``tests/evals/``): ``mc.jsonl``, 48 multiple-choice questions written for these
tests (``question``, four ``choices``, ``answer`` index); ``gen.jsonl``, 8 short completions
(``prompt``, ``answer``); ``ppl.jsonl``, 6 sentences for perplexity. :func:`write_tasks` writes
the lm-eval task YAMLs (``dataset_path: json`` with the absolute data paths, so everything runs
offline) into a folder for ``--include_path`` / ``TaskManager(include_path=...)``.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).parent / "evals"

MC_TASK = "batchclient_mc"
GEN_TASK = "batchclient_gen"
PPL_TASK = "batchclient_ppl"

_MC = """task: batchclient_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/mc.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
  - metric: acc_norm
"""

_GEN = """task: batchclient_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/gen.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 12
  do_sample: false
metric_list:
  - metric: exact_match
    ignore_case: true
    ignore_punctuation: true
filter_list:
  - name: strip
    filter:
      - function: regex
        regex_pattern: "(\\\\w+)"
        group_select: 0
      - function: take_first
"""

_PPL = """task: batchclient_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/ppl.jsonl
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


def write_tasks(folder: Path) -> Path:
    """Write the three task YAMLs into ``folder``; return it."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in ((MC_TASK, _MC), (GEN_TASK, _GEN), (PPL_TASK, _PPL)):
        (folder / f"{name}.yaml").write_text(text.format(data=DATA.resolve()))
    return folder
