"""The whole benchmark as a script next to the others: the same as ``batchclient
bench`` (every option passes through; guide: docs/benchmarks.md).

    python bench/bench.py -n 256            # = make bench
    python bench/bench.py -n 16 --modes sequential remote openai-gather --base-url URL

Writes bench/results/bench.json, bench.png and bench.md, and prints the Markdown table.
"""

from __future__ import annotations

import sys

from batchclient.cli import main

if __name__ == "__main__":  # the engine modes run in child processes; keep the guard anyway
    sys.exit(main(["bench", *sys.argv[1:]]))
