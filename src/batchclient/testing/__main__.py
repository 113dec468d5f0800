"""``python -m batchclient.testing stub [options]``: the stub server as its own process."""

from ._process import main

main()
