"""``python -m batchclient.cli``: the ``batchclient`` command."""

import sys

from . import main

sys.exit(main())
