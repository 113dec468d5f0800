"""``POST /v1/files`` bodies: ``multipart/form-data`` parsed as it arrives, the ``file`` part
written straight into the state directory, so memory stays flat whatever the file's size.

The request body is read with ``request.stream()`` (uvicorn stops reading the socket while the
app has not taken what it got) and fed to python-multipart's streaming parser; the file part's
bytes are gathered up to 1 MiB and written from a worker thread into a
:class:`~batchclient.jobs.StagedFile`. The other fields (``purpose``) are small and kept.
Everything held in memory is bounded whatever the framing (``Content-Length`` or chunked):
at most :data:`MAX_FIELDS` other fields of :data:`FIELDS_LIMIT` bytes in all, part headers of
:data:`HEADERS_LIMIT` bytes each, and the whole body at most the file's cap plus
:data:`OVERHEAD` bytes. A second file, a file over the size cap, a body over these bounds,
one that is not multipart or ends before its closing boundary are refused (400, or 413 for a
size) and the staged bytes are deleted. The file name is metadata only: the stored file is
named by its id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from anyio import to_thread
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request

from ..jobs._files import StagedFile
from ._errors import APIError

if TYPE_CHECKING:  # python-multipart declares its callback types for type checkers only
    from python_multipart.multipart import MultipartCallbacks

FIELDS_LIMIT = 64 * 1024
"""Bytes of all the non-file fields together."""
MAX_FIELDS = 16
"""Most non-file fields (parts) in one upload."""
HEADERS_LIMIT = 8 * 1024
"""Bytes of one part's headers."""
OVERHEAD = 256 * 1024
"""Bytes of a body beyond the file's own: framing, part headers and fields."""
FILENAME_LIMIT = 255
_WRITE_BYTES = 1 << 20


@dataclass
class Upload:
    """What a multipart upload held besides the file's bytes."""

    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    file_parts: int = 0


async def receive_upload(request: Request, staged: StagedFile, max_bytes: int) -> Upload:
    """Parse the request body into ``staged`` (the ``file`` part) and the other fields.

    Raises ``APIError`` 400 for a body that is not a complete ``multipart/form-data`` body, 413
    when the file is over ``max_bytes``. The caller discards ``staged`` on error."""
    kind, options = parse_options_header(request.headers.get("content-type"))
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise APIError(
            400, "the body must be multipart/form-data with a 'file' part and a 'purpose' field"
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes + OVERHEAD:
        raise _too_large(max_bytes)
    receiver = _Receiver(staged, max_bytes)
    try:
        parser = MultipartParser(boundary, receiver.callbacks())
    except (FormParserError, ValueError) as exc:
        raise APIError(400, f"malformed multipart boundary: {exc}") from None
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > max_bytes + OVERHEAD:  # chunked bodies declare no length
                raise _too_large(max_bytes)
            try:
                parser.write(chunk)
            except FormParserError as exc:
                raise APIError(400, f"malformed multipart body: {exc}") from None
            if receiver.pending_bytes >= _WRITE_BYTES:
                await receiver.flush()
    except ClientDisconnect:
        raise APIError(400, "the client closed the connection during the upload") from None
    parser.finalize()
    if not receiver.ended:
        raise APIError(400, "the multipart body ended before its closing boundary")
    await receiver.flush()
    return receiver.upload


def _too_large(max_bytes: int) -> APIError:
    return APIError(
        413,
        f"the file is over this server's limit of {max_bytes} bytes (max_upload_bytes)",
        param="file",
        code="file_too_large",
    )


class _Receiver:
    """python-multipart callbacks: headers of each part, its data, its end."""

    def __init__(self, staged: StagedFile, max_bytes: int) -> None:
        self.staged = staged
        self.max_bytes = max_bytes
        self.upload = Upload()
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.file_bytes = 0
        self.ended = False
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._disposition: bytes | None = None
        self._in_file = False
        self._name = ""
        self._value = bytearray()
        self._header_bytes = 0
        self._fields = 0
        self._field_bytes = 0

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_val,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
            "on_end": self._end,
        }

    def _part_begin(self) -> None:
        self._disposition = None
        self._in_file = False
        self._value = bytearray()
        self._header_bytes = 0

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_name += data[start:end]

    def _header_val(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_value += data[start:end]

    def _count_header(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > HEADERS_LIMIT:
            raise APIError(400, f"a part's headers are over {HEADERS_LIMIT} bytes")

    def _header_end(self) -> None:
        if bytes(self._header_name).lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name, self._header_value = bytearray(), bytearray()

    def _headers_finished(self) -> None:
        _, params = parse_options_header(self._disposition)
        self._name = params.get(b"name", b"").decode("utf-8", "replace")
        if self._name == "file":
            self.upload.file_parts += 1
            if self.upload.file_parts > 1:
                raise APIError(400, "the upload has more than one 'file' part", param="file")
            self._in_file = True
            raw = params.get(b"filename", b"upload").decode("utf-8", "replace")
            # metadata only, never a path; printable and bounded so listings stay readable
            name = "".join(c for c in raw if c.isprintable())[:FILENAME_LIMIT]
            self.upload.filename = name or "upload"
            return
        self._fields += 1
        if self._fields > MAX_FIELDS:
            raise APIError(400, f"the upload has more than {MAX_FIELDS} fields besides 'file'")

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._in_file:
            self.file_bytes += end - start
            if self.file_bytes > self.max_bytes:
                raise _too_large(self.max_bytes)
            self.pending.append(bytes(data[start:end]))
            self.pending_bytes += end - start
            return
        self._field_bytes += end - start
        if self._field_bytes > FIELDS_LIMIT:
            raise APIError(
                413,
                f"the fields besides 'file' are over {FIELDS_LIMIT} bytes in all",
                param=self._name[:64],
                code="request_too_large",
            )
        self._value += data[start:end]

    def _part_end(self) -> None:
        if not self._in_file and self._name:
            self.upload.fields[self._name] = self._value.decode("utf-8", "replace")
        self._in_file = False

    def _end(self) -> None:
        self.ended = True

    async def flush(self) -> None:
        if not self.pending:
            return
        data = b"".join(self.pending)
        self.pending, self.pending_bytes = [], 0
        await to_thread.run_sync(self.staged.write, data)
