"""Blobs through the Python client: put from a path, upload a file object, read back with the file API."""
import hashlib
import io
import os

import pytest

import blazedb
from blazedb.blobs import open_blob, upload


def test_a_file_put_and_uploaded_is_one_blob_read_back_as_a_file(daemon):
    content = os.urandom(2_500_000)
    path = os.path.join(daemon.dir, "photo.jpg")
    with open(path, "wb") as f:
        f.write(content)
    with blazedb.Client(daemon.socket) as client:
        put = client.blob.put(db="default", path=path, type="image/jpeg")
        assert put["blob"]["size"] == len(content) and put["ref"] == {"$blob": put["blob"]}
        sent = upload(client, "default", io.BytesIO(content), type="image/jpeg", piece=700_000)
        assert sent["blob"]["id"] == put["blob"]["id"] and sent["storedBytes"] == 0
        with open_blob(client, "default", put["blob"]["id"]) as f:
            assert hashlib.sha256(f.read()).digest() == hashlib.sha256(content).digest()
            f.seek(1_000_000)
            assert f.read(10) == content[1_000_000:1_000_010]
            f.seek(-5, io.SEEK_END)
            assert f.read() == content[-5:]
            assert f.read() == b""
        client.doc.insert(db="default", collection="photos", doc={"_id": "p", "file": put["ref"]})
        found = client.query.find(db="default", collection="photos", where={"file.$blob.type": "image/jpeg"})
        assert [d["_id"] for d in found["docs"]] == ["p"]


def test_blob_errors_are_typed(daemon):
    with blazedb.Client(daemon.socket) as client:
        with pytest.raises(blazedb.NotFoundError) as e:
            client.blob.stat(db="default", blob="ab" * 32)
        assert e.value.kind == "blob_not_found"
        with pytest.raises(blazedb.InvalidParamsError) as e:
            client.blob.put(db="default", path="relative")
        assert e.value.kind == "invalid_path"
        with pytest.raises(ValueError):
            upload(client, "default", io.BytesIO(b"x"), piece=0)


class _Broken(io.RawIOBase):
    """A file that yields one piece, then fails as a disk or a network would."""

    def __init__(self) -> None:
        self.calls = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        self.calls += 1
        if self.calls > 1:
            raise OSError("the source went away")
        return b"x" * 1000


def test_an_upload_whose_source_fails_is_aborted_and_frees_its_slot(daemon):
    with blazedb.Client(daemon.socket) as client:
        # A connection holds at most 4 uploads: five failing uploads in a row work only if each one is aborted.
        for _ in range(5):
            with pytest.raises(OSError):
                upload(client, "default", _Broken())
        opened = [client.blob.upload(db="default")["upload"] for _ in range(4)]
        assert len(set(opened)) == 4
