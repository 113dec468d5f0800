"""``python -m batchclient.integrations.lm_eval [lm-eval arguments]``: lm-eval's command line
with ``--model batchclient`` registered (and its ``vllm`` backend working on CPU builds)."""

import sys

from ._cli import run_lm_eval

if __name__ == "__main__":
    sys.exit(run_lm_eval(sys.argv[1:]))
