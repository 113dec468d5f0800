"""Durable batch jobs over OpenAI batch JSONL, on any provider (guide: ``docs/jobs.md``).

Clients expose them as ``client.files``, ``client.batches`` and the original protocol's
``schedule_batch`` / ``job_*`` calls. This package also offers, for tools that work on a state
directory without running jobs (the ``batchclient jobs`` commands):

- :class:`JobManager`: list, inspect, cancel, resume and export the batches of a state directory;
- :func:`validate_batch_file`: validate an OpenAI batch input file (streamed, all-or-nothing);
- :func:`estimate_file`: a dry run of a batch file (nothing sent);
- :func:`default_state_dir`: where state lives by default;
- :class:`LeaseTimes`: how a manager keeps its leases (heartbeat, orphan scan, lease).

The second group of names are building blocks for batchclient's other packages (its modules
import only this package's ``__init__``): the Batch API client runs jobs through the store, the
runner and the output rows; the server, the CLI and Ray Data read and check request lines as
validation does.
"""

from ._files import Files
from ._lease import LeaseTimes
from ._manager import Batches, JobManager
from ._validate import validate_batch_file

__all__ = [
    "Batches",
    "Files",
    "JobManager",
    "LeaseTimes",
    "validate_batch_file",
]
