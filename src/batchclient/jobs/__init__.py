"""Durable batch jobs over OpenAI batch JSONL, on any provider (guide: ``docs/jobs.md``).

Clients expose them as ``client.files``, ``client.batches`` and the original protocol's
``schedule_batch`` / ``job_*`` calls. This package also offers, for tools that work on a state
directory without running jobs (the ``batchclient jobs`` commands):

- :class:`JobManager`: list, inspect, cancel and export the batches of a state directory;
- :func:`validate_batch_file`: validate an OpenAI batch input file (streamed, all-or-nothing);
- :func:`estimate_file`: a dry run of a batch file (nothing sent);
- :func:`default_state_dir`: where state lives by default.
"""

from ._estimate import describe, estimate_file
from ._files import Files, StagedFile
from ._manager import Batches, JobManager
from ._runner import JobRunner, RunningJob, WriteRetry, parse_window
from ._store import default_state_dir
from ._validate import ValidationReport, validate_batch_file

__all__ = [
    "Batches",
    "Files",
    "JobManager",
    "JobRunner",
    "RunningJob",
    "StagedFile",
    "ValidationReport",
    "WriteRetry",
    "default_state_dir",
    "describe",
    "estimate_file",
    "parse_window",
    "validate_batch_file",
]
