"""``client.files``: upload, list, read and delete files in the state directory (OpenAI
``/v1/files`` in spirit). Uploads are streamed in 1 MiB chunks, never read whole into memory;
:meth:`Files.stage` / :meth:`Files.commit` take the bytes piece by piece from a caller that
receives them itself (``batchclient serve`` writes a multipart upload straight into one)."""

from __future__ import annotations

import hashlib
import io
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

import anyio
from anyio import to_thread

from ..errors import ConfigurationError, JobStateError
from ..types import FileDeleted, FileObject
from ._lease import hold, remove_if_unlocked
from ._store import Store, now

_CHUNK = 1024 * 1024
FileInput = str | os.PathLike[str] | bytes | IO[bytes] | IO[str]


class Files:
    """The files of one state directory. Every method needs the owning client (or job
    manager) to be open (else ``ClientClosedError``); unknown ids raise
    ``FileNotFoundInStoreError``."""

    def __init__(self, store: Callable[[], Awaitable[Store]]) -> None:
        self._store = store

    async def create(
        self, file: FileInput, *, purpose: str = "batch", filename: str | None = None
    ) -> FileObject:
        """Store a file: a path, ``bytes``, or a file object (binary, or text encoded as
        UTF-8), copied in 1 MiB chunks. ``purpose`` is ``"batch"`` for batch input files.
        ``filename`` defaults to the path's name (``"upload.jsonl"`` for bytes and streams).

        Returns the ``FileObject`` (``id``, ``bytes``, ``filename``, ``created_at``,
        ``purpose``). Raises ``ConfigurationError`` for a path that is not a readable file."""
        store = await self._store()
        if isinstance(file, str | os.PathLike):
            path = Path(file)
            if not await anyio.Path(path).is_file():
                raise ConfigurationError(f"{path} is not a file")
            name = filename or path.name
        else:
            name = filename or getattr(file, "name", None) or "upload.jsonl"
            name = Path(str(name)).name
        return await to_thread.run_sync(store_file, store, file, purpose, name)

    async def stage(self) -> StagedFile:
        """A new file being written into the state directory: :meth:`StagedFile.write` its
        bytes (blocking: call it from a worker thread), then :meth:`commit` it, or
        :meth:`StagedFile.discard` it. Nothing is listed until it is committed."""
        store = await self._store()
        return await to_thread.run_sync(StagedFile, store)

    async def commit(self, staged: StagedFile, *, purpose: str, filename: str) -> FileObject:
        """Make a staged file a stored file (its ``id`` and record; ``filename`` is metadata
        only, never a path) and return its ``FileObject``."""
        store = await self._store()
        return await to_thread.run_sync(staged.commit, store, purpose, filename)

    async def retrieve(self, file_id: str) -> FileObject:
        """The record of one file."""
        store = await self._store()
        record: FileObject = await to_thread.run_sync(store.get_file, file_id)
        return record

    async def content(self, file_id: str) -> bytes:
        """The whole content of a file, in memory. For large files read :meth:`path`."""
        store = await self._store()
        await to_thread.run_sync(store.get_file, file_id)
        return await to_thread.run_sync(store.file_path(file_id).read_bytes)

    async def path(self, file_id: str) -> Path:
        """Where the file's bytes are on disk (read it, do not change it)."""
        store = await self._store()
        await to_thread.run_sync(store.get_file, file_id)
        return store.file_path(file_id)

    async def list(self, purpose: str | None = None) -> list[FileObject]:
        """Every file (optionally only those of one ``purpose``), newest first."""
        store = await self._store()
        files: list[FileObject] = await to_thread.run_sync(store.list_files, purpose)
        return files

    async def delete(self, file_id: str) -> FileDeleted:
        """Delete a file. Raises ``JobStateError`` for the input file of a batch that is not
        finished (it is needed to resume the batch)."""
        store = await self._store()
        users = await to_thread.run_sync(store.delete_unused_file, file_id)
        if users:
            raise JobStateError(f"file {file_id} is the input of unfinished batch(es) {users}")
        return FileDeleted(id=file_id)


class StagedFile:
    """The bytes of a file being stored, in a temporary file (mode 0600) next to where it will
    live; ``bytes`` counts what was written so far. Blocking methods (call them from a worker
    thread)."""

    def __init__(self, store: Store) -> None:
        self.id = f"file-{secrets.token_hex(12)}"
        self.bytes = 0
        self._target = store.file_path(self.id)
        self._tmp = self._target.with_name(f".{self.id}.tmp")
        while True:  # locked while it is open: the start-up sweep leaves it alone
            fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            if hold(fd, self._tmp):
                break
            os.close(fd)  # swept before it was locked: create it again
        self._file: IO[bytes] | None = os.fdopen(fd, "wb")
        self._digest = hashlib.sha256()

    def write(self, data: bytes) -> None:
        assert self._file is not None, "the staged file was committed or discarded"
        self._file.write(data)
        self._digest.update(data)
        self.bytes += len(data)

    def commit(self, store: Store, purpose: str, filename: str) -> FileObject:
        assert self._file is not None, "the staged file was committed or discarded"
        self._file.close()
        self._file = None
        os.replace(self._tmp, self._target)
        record = FileObject(
            id=self.id, bytes=self.bytes, created_at=now(), filename=filename, purpose=purpose
        )
        store.add_file(record, self._digest.hexdigest())
        return record

    def discard(self) -> None:
        """Remove the temporary file (does nothing after ``commit``)."""
        if self._file is not None:
            self._file.close()
            self._file = None
            self._tmp.unlink(missing_ok=True)


def sweep_temporary(store: Store) -> tuple[int, int]:
    """Remove the temporary files of ``files/`` (``.*.tmp``: uploads and output files being
    written) that a process killed while writing left behind: those no live writer holds (their
    lock is free), however recent, so a server restarted right after a crash sweeps what it
    left. A writer locks its file as it creates it, and creates it again if a sweep took it in
    between (:func:`hold`). Returns (files, bytes) removed (blocking)."""
    count = size = 0
    try:
        entries = list(os.scandir(store.files_dir))
    except OSError:
        return 0, 0
    for entry in entries:
        if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not entry.is_file(follow_symlinks=False):
            continue
        if remove_if_unlocked(Path(entry.path)):
            count, size = count + 1, size + st.st_size
    return count, size


def store_file(store: Store, file: FileInput, purpose: str, filename: str) -> FileObject:
    """Copy ``file`` into the store as a new file (blocking: run it in a worker thread)."""
    staged = StagedFile(store)
    try:
        for chunk in _chunks(file):
            staged.write(chunk)
        return staged.commit(store, purpose, filename)
    finally:
        staged.discard()


def _chunks(file: Any) -> Any:
    if isinstance(file, bytes):
        yield from (file[i : i + _CHUNK] for i in range(0, len(file), _CHUNK))
        return
    if isinstance(file, str | os.PathLike):
        with open(file, "rb") as f:
            yield from iter(lambda: f.read(_CHUNK), b"")
        return
    if isinstance(file, io.TextIOBase):
        yield from (s.encode("utf-8") for s in iter(lambda: file.read(_CHUNK), ""))
        return
    while chunk := file.read(_CHUNK):
        yield chunk.encode("utf-8") if isinstance(chunk, str) else chunk
