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

from ._estimate import describe, estimate_file
from ._files import Files, StagedFile, store_file
from ._lease import LeaseTimes
from ._manager import Batches, JobManager, StatusTotals
from ._output import request_for, row_for
from ._progress import ProgressTracker
from ._runner import (
    JobRunner,
    RunningJob,
    WriteRetry,
    finalize,
    parse_window,
    run_unfinished,
    validate_job,
)
from ._store import DB_NAME, JobRow, ResultRow, Store, default_state_dir
from ._validate import (
    RequestLine,
    ValidationReport,
    check_request,
    file_endpoint,
    is_blank,
    iter_lines,
    iter_requests,
    parse_line,
    validate_batch_file,
)

__all__ = [
    "DB_NAME",
    "Batches",
    "Files",
    "JobManager",
    "JobRow",
    "JobRunner",
    "LeaseTimes",
    "ProgressTracker",
    "RequestLine",
    "ResultRow",
    "RunningJob",
    "StagedFile",
    "StatusTotals",
    "Store",
    "ValidationReport",
    "WriteRetry",
    "check_request",
    "default_state_dir",
    "describe",
    "estimate_file",
    "file_endpoint",
    "finalize",
    "is_blank",
    "iter_lines",
    "iter_requests",
    "parse_line",
    "parse_window",
    "request_for",
    "row_for",
    "run_unfinished",
    "store_file",
    "validate_batch_file",
    "validate_job",
]
