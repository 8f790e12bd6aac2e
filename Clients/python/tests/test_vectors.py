"""Vectors through the Python client: lists, array('f') and numpy arrays in, floats back, nearest documents."""
import math
import random
from array import array

import pytest

import blazedb
from blazedb.vectors import floats, vector


def _nearest_ids(rows, q, k):
    def cosine(v):
        dot = sum(a * b for a, b in zip(v, q))
        return 1 - dot / math.sqrt(sum(a * a for a in v) * sum(b * b for b in q))
    return [i for i, _ in sorted(rows.items(), key=lambda item: cosine(item[1]))[:k]]


def test_vectors_go_in_as_lists_arrays_and_numpy_and_come_back_as_floats(daemon):
    numpy = pytest.importorskip("numpy")
    rng = random.Random(7)
    rows = {f"d{i}": array("f", [rng.uniform(-1, 1) for _ in range(32)]) for i in range(200)}
    with blazedb.Client(daemon.socket) as client:
        info = client.index.create(db="default", collection="p", fields=["v"], vector={"dimensions": 32, "metric": "cosine"})
        assert info["vector"] == {"dimensions": 32, "metric": "cosine"}
        for n, (id, v) in enumerate(rows.items()):
            given = [list(v), v, numpy.array(v, dtype=numpy.float64)][n % 3]
            client.doc.put(db="default", collection="p", id=id, doc={"v": vector(given), "n": n})
        # Stored as float32, read back exactly as put.
        assert floats(client.doc.get(db="default", collection="p", id="d2")["doc"]["v"]) == rows["d2"]
        as_numbers = client.doc.get(db="default", collection="p", id="d2", vectors="array")["doc"]["v"]
        assert floats(as_numbers) == rows["d2"]
        q = array("f", [rng.uniform(-1, 1) for _ in range(32)])
        expected = _nearest_ids(rows, q, 5)
        # The query vector as a list, an array('f') (sent as base64) and a numpy float32 array (base64 too).
        for given in [list(q), q, numpy.array(q, dtype=numpy.float32)]:
            hits = client.query.nearest(db="default", collection="p", field="v", vector=given, k=5)
            assert [h["doc"]["_id"] for h in hits["results"]] == expected
            assert hits["index"] == "p.v" and hits["metric"] == "cosine"
        filtered = client.query.nearest(db="default", collection="p", field="v", vector=q, k=3, where={"n": {"$lt": 10}})
        assert all(h["doc"]["n"] < 10 for h in filtered["results"]) and len(filtered["results"]) == 3
        with pytest.raises(blazedb.InvalidParamsError) as e:
            client.query.nearest(db="default", collection="p", field="v", vector=[1.0, 2.0], k=3)
        assert e.value.kind == "invalid_vector"
        with pytest.raises(blazedb.InvalidParamsError) as e:
            client.doc.put(db="default", collection="p", id="bad", doc={"v": {"$vector": [1.0, "x"]}})
        assert e.value.kind == "invalid_vector"
