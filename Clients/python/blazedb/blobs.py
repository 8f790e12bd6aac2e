"""Blobs as Python files: read a blob with the file API, upload a file object in-band.

    from blazedb.blobs import open_blob, upload
    with open_blob(client, "photos", blob_id) as f:   # a buffered, seekable binary file
        header = f.read(16)
    result = upload(client, "photos", open("cat.jpg", "rb"), type="image/jpeg")

`client.blob.put(db=..., path=...)` stores a file the daemon can read itself; `upload` sends the bytes over the
socket (blob.upload, blob.append, blob.finish), for a daemon that does not share this file system. Both return the
same result, whose `ref` is what a document holds to refer to the blob.
"""

import base64
import io
from typing import Any, BinaryIO, Dict, Optional

from ._runtime import MISSING

READ_MAX = 4 << 20
"""Most bytes one blob.read returns."""


class BlobReader(io.RawIOBase):
    """A blob of a database as a raw, seekable, read-only binary file: each read is a blob.read of that range."""

    def __init__(self, client: Any, db: str, blob: str):
        super().__init__()
        self._client = client
        self._db = db
        self._blob = blob
        self._pos = 0
        self.size: int = client.blob.stat(db=db, blob=blob)["size"]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._pos >= self.size or len(view) == 0:
            return 0
        result = self._client.blob.read(db=self._db, blob=self._blob, offset=self._pos, length=min(len(view), READ_MAX))
        data = base64.b64decode(result["data"])
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


def open_blob(client: Any, db: str, blob: str, buffer_size: int = READ_MAX) -> io.BufferedReader:
    """Blob `blob` of database `db` as a buffered binary file (reads of `buffer_size` bytes go to the daemon)."""
    return io.BufferedReader(BlobReader(client, db, blob), buffer_size=buffer_size)


def upload(client: Any, db: str, file: BinaryIO, type: Optional[str] = None, piece: int = 1 << 20) -> Dict[str, Any]:
    """Stores what `file` reads (to its end) as a blob of `db`, `piece` bytes per blob.append (at most 4 MiB);
    returns what blob.finish returns. If reading `file` or a call fails, the upload is aborted (blob.abort) before the
    error is raised, so its slot is free at once."""
    if not 0 < piece <= READ_MAX:
        raise ValueError(f"piece must be 1 to {READ_MAX} bytes")
    upload_id = client.blob.upload(db=db, type=MISSING if type is None else type)["upload"]
    try:
        while True:
            data = file.read(piece)
            if not data:
                break
            client.blob.append(db=db, upload=upload_id, data=base64.b64encode(data).decode("ascii"))
        result: Dict[str, Any] = client.blob.finish(db=db, upload=upload_id)
        return result
    except BaseException:
        try:
            client.blob.abort(db=db, upload=upload_id)
        except Exception:
            pass  # ended already (a failed append ends it), or the connection is gone, which ends it too
        raise
