"""lm-evaluation-harness over batchclient (guide: ``docs/evals.md``).

Importing this module registers :class:`BatchClientLM` with lm-eval as ``batchclient``; lm-eval
(``pip install 'batchclient[eval]'``) is needed. From the shell::

    batchclient lm-eval --provider remote --base-url http://127.0.0.1:8000/v1 --model smollm2 \\
        --tokenizer DIR -- --tasks arc_easy --limit 100
    python -m batchclient.integrations.lm_eval run --model batchclient \\
        --model_args provider=vllm --tasks arc_easy

- :class:`BatchClientLM`: the model (``loglikelihood``, ``loglikelihood_rolling``,
  ``generate_until``, chat templates), its answers kept in the state directory;
- :func:`run_lm_eval`: lm-eval's command line with the model registered and lm-eval's ``vllm``
  backend fixed for CPU builds of vLLM (:func:`fix_vllm_version_lookup`).
"""

try:
    import lm_eval  # noqa: F401
except ImportError as exc:  # pragma: no cover - the eval extra is not installed
    raise ImportError(
        f"batchclient.integrations.lm_eval needs lm-eval: pip install 'batchclient[eval]' ({exc})"
    ) from exc

from ._cli import fix_vllm_version_lookup, run_lm_eval
from ._model import BatchClientLM, close_all

__all__ = ["BatchClientLM", "close_all", "fix_vllm_version_lookup", "run_lm_eval"]
