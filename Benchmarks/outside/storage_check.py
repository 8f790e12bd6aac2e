"""The outside check's storage client: an independent program (standard library only) that does, through blazed's
socket, what a user checking storage would: 10,000 documents, then 100,000 two-field patches in `tx.commit`s of 500,
then `db.compact`, then `db.info`'s `sizeBytes`; and writes the same documents, read back with `query.find`, into a
plain SQLite table `(collection, id, body)` with its unique index. Prints `blazed-bytes plain-bytes`.

    python3 storage_check.py SOCKET DATABASE bench|small
"""

import json
import os
import socket
import sqlite3
import sys
import tempfile


def main() -> None:
    path, db, shape = sys.argv[1:4]
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    stream = sock.makefile("rwb")
    counter = 0

    def call(method: str, params: dict) -> dict:
        nonlocal counter
        counter += 1
        stream.write((json.dumps({"jsonrpc": "2.0", "id": counter, "method": method, "params": params}) + "\n").encode())
        stream.flush()
        reply = json.loads(stream.readline())
        if "error" in reply:
            raise SystemExit(f"{method}: {reply['error']}")
        return reply["result"]

    def document(i: int) -> dict:
        if shape == "small":
            return {"_id": "doc-%08d" % i, "n": i, "name": "item %d" % i}
        return {"_id": "doc-%08d" % i, "name": "user number %d with a longer display name" % i,
                "email": "user%d@example.com" % i, "age": i % 90, "score": i * 1.25,
                "tags": ["alpha", "beta", "t%d" % (i % 17)], "bio": "x" * 70}

    call("db.create", {"db": db})
    for start in range(0, 10_000, 500):
        call("tx.commit", {"db": db, "ops": [{"op": "insert", "collection": "c", "doc": document(i)}
                                             for i in range(start, start + 500)]})
    for start in range(0, 100_000, 500):
        call("tx.commit", {"db": db, "ops": [{"op": "patch", "collection": "c", "id": "doc-%08d" % (i * 7919 % 10_000),
                                              "set": {"score": float(i), "name": "n-%d" % i}}
                                             for i in range(start, start + 500)]})
    call("db.compact", {"db": db})
    size = call("db.info", {"db": db})["sizeBytes"]
    docs = call("query.find", {"db": db, "collection": "c", "limit": 10_000})["docs"]
    assert len(docs) == 10_000, len(docs)
    with tempfile.TemporaryDirectory() as scratch:
        plain = os.path.join(scratch, "plain.sqlite")
        table = sqlite3.connect(plain)
        table.execute("PRAGMA journal_mode=WAL")
        table.execute("CREATE TABLE t(collection TEXT, id TEXT, body TEXT, UNIQUE(collection, id))")
        table.executemany("INSERT INTO t VALUES ('c', ?, ?)",
                          [(d["_id"], json.dumps(d, separators=(",", ":"), sort_keys=True)) for d in docs])
        table.commit()
        table.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        table.close()
        print(size, os.path.getsize(plain))


if __name__ == "__main__":
    main()
