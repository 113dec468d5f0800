"""``python -m batchclient.integrations.lm_eval [lm-eval arguments]``: lm-eval's command line
with ``--model batchclient`` registered (and its ``vllm`` backend working on CPU builds).

Once lm-eval is done (its results written), the process ends its own child processes and
exits without the interpreter's teardown: with lm-eval's ``vllm`` backend, that teardown can
abort the process ("terminate called without an active exception", exit status 134) after a
successful run, while the engine's processes are still being shut down."""

import contextlib
import os
import sys

from ._cli import run_lm_eval


def _end_children(timeout_s: float = 10.0) -> None:
    """Terminate this process's descendants (engine processes a backend left), then kill
    those still running after ``timeout_s``."""
    try:
        import psutil
    except ImportError:  # no engine without vLLM, and vLLM needs psutil
        return
    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=timeout_s)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()


if __name__ == "__main__":
    code = run_lm_eval(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    _end_children()
    os._exit(code)
