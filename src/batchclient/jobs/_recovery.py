"""After a late failure: what the batch says, what ``job_result`` returns, how it resumes.

A late failure is one after validation: the output or error file could not be written, or the
state directory failed while results were committed (a full disk, a folder replaced by a file).
Committed results are never lost to it: ``job_result`` returns them, with every line that has
none as ``batch_failed``, and :func:`reopen` makes the batch ``in_progress`` again so that it
sends only what has no result and then writes its files.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

from .._state import DB_ERRORS
from ..errors import ErrorCode, JobStateError
from ..types import BatchChatCompletionResponse, BatchError, BatchItemError, ChatCompletionResponse
from ._output import response_for
from ._store import DB_NAME, Store
from ._validate import iter_requests


def failure_of(exc: BaseException, state_dir: Path) -> BatchError:
    """The batch error for an exception that stopped a running batch: ``storage_error`` (with
    the path and the OS or SQLite error) for the state directory failing, else
    ``internal_error``. An exception group (from a task group) is told by its first leaf."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, OSError):
        where = exc.filename or state_dir
        reason = f"[Errno {exc.errno}] {exc.strerror}" if exc.strerror else str(exc)
        message = f"the state directory failed under the batch: {where}: {reason}"
        if exc.filename == str(state_dir / DB_NAME) and exc.errno == errno.ENOENT:
            message += (
                " (moved, removed or replaced while the batch ran: its results are only in "
                "the database this process has open, where job_result still reads them)"
            )
        return BatchError(code=ErrorCode.storage_error.value, message=message)
    if isinstance(exc, DB_ERRORS):
        message = f"the state database failed under the batch: {state_dir / DB_NAME}: {exc}"
        return BatchError(code=ErrorCode.storage_error.value, message=message)
    return BatchError(code=ErrorCode.internal_error.value, message=f"{type(exc).__name__}: {exc}")


def late_result(store: Store, job_id: str) -> BatchChatCompletionResponse:
    """``job_result`` of a batch that failed after validation: one item per line in input
    order, the committed result where there is one, else ``batch_failed`` naming the batch's
    error. Reads only the results when every line has one (the state directory may be what
    failed); the ``custom_id`` of a line without a result comes from the input file, when it
    can still be read (blocking)."""
    row = store.job_row(job_id)
    errors = json.loads(row.errors or "[]")
    why = f"{errors[0].get('code')}: {errors[0].get('message')}" if errors else "unknown"
    error = BatchItemError(
        code=ErrorCode.batch_failed.value,
        message=f"the batch failed before this request finished ({why})",
    )
    stored = {r.seq: response_for(r) for r in store.iter_results(job_id)}
    total = int(row.total)
    ids: dict[int, str] = {}
    if len(stored) < total:
        try:
            with store.file_path(row.input_file_id).open("rb") as f:
                ids = {
                    line.seq: line.custom_id for line in iter_requests(f) if line.seq not in stored
                }
        except OSError:
            pass  # the input is gone with the rest: positions still tell the lines apart
    batch = [
        stored.get(seq) or ChatCompletionResponse(error=error, custom_id=ids.get(seq))
        for seq in range(total)
    ]
    return BatchChatCompletionResponse(batch=batch)


def reopen(store: Store, job_id: str, owner: str | None, expected_owner: str | None) -> None:
    """Make a batch that failed after validation ``in_progress`` again under ``owner``'s
    lease (None: a free lease, for whoever can run it). Raises ``JobStateError`` for any other
    batch or when another owner took it."""
    row = store.job_row(job_id)
    if row.status != "failed" or row.in_progress_at is None:
        raise JobStateError(
            f"job {job_id} is {row.status}: only a batch that failed after validation "
            "can be resumed"
        )
    if not store.claim(job_id, owner, expected_owner):
        raise JobStateError(f"job {job_id} was taken by another process")
    store.update_job(
        job_id,
        where_status=("failed",),
        status="in_progress",
        failed_at=None,
        finalizing_at=None,
        errors=None,
    )
