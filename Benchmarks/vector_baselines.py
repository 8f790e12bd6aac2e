#!/usr/bin/env python3
"""The vector libraries blazebench's VECTOR group compares with, on the same vectors and queries, one thread.

blazebench writes `vectors.f32` (N × D little-endian float32), `queries.f32` (Q × D) and `filter.u8` (one byte per
vector: 1 when the vector is in the filtered tenth) into DIR, then runs

    python vector_baselines.py DIR N D Q K

which prints one JSON object per line: `{"name", "latencies_us": [...], ...}` with per-query latencies (each query
searched alone, as a request would), the ids each system returned for the first queries (`ids`) so blazebench can
check them against its own exact answer, and for approximate indexes their build time, recall@K against exact
search and memory. Exact search: FAISS `IndexFlatL2` and sqlite-vec's `vec0` (brute force). Approximate: hnswlib
and FAISS `IndexHNSWFlat` (M = 16, efConstruction = 200), at the smallest efSearch reaching recall@K ≥ 0.95.
A library that is not installed is reported as missing (`{"name", "missing": "..."}`), not as an error.

Run by `make bench-vectors` in a throwaway venv (`pip install numpy faiss-cpu hnswlib sqlite-vec apsw`).
"""

import json
import os
import sys
import time


def emit(**row):
    print(json.dumps(row), flush=True)


def timed_queries(queries, search):
    latencies, answers = [], []
    for q in queries:
        start = time.perf_counter_ns()
        ids = search(q)
        latencies.append((time.perf_counter_ns() - start) / 1000)
        answers.append([int(i) for i in ids])
    return latencies, answers


def recall(answers, exact, k):
    hits = sum(len(set(a[:k]) & set(e[:k])) for a, e in zip(answers, exact))
    return hits / (k * len(exact))


def main():
    directory, n, d, q, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    try:
        import numpy as np
    except ImportError as e:
        emit(name="baselines", missing=str(e))
        return
    vectors = np.fromfile(os.path.join(directory, "vectors.f32"), dtype="<f4").reshape(n, d)
    queries = np.fromfile(os.path.join(directory, "queries.f32"), dtype="<f4").reshape(q, d)
    in_filter = np.fromfile(os.path.join(directory, "filter.u8"), dtype=np.uint8).astype(bool)
    exact = None

    try:
        import faiss
        faiss.omp_set_num_threads(1)
        start = time.perf_counter()
        flat = faiss.IndexFlatL2(d)
        flat.add(vectors)
        build = time.perf_counter() - start
        latencies, exact = timed_queries(queries, lambda v: flat.search(v.reshape(1, d), k)[1][0])
        emit(name="faiss.flat", latencies_us=latencies, ids=exact[:20], build_s=build)
        # Filtered: FAISS's selector over the filtered tenth (an IDSelectorBatch), exact.
        allowed = np.nonzero(in_filter)[0].astype("int64")
        params = faiss.SearchParameters(sel=faiss.IDSelectorBatch(allowed))
        latencies, answers = timed_queries(queries, lambda v: flat.search(v.reshape(1, d), k, params=params)[1][0])
        emit(name="faiss.flat.filtered", latencies_us=latencies, ids=answers[:20])
    except ImportError as e:
        emit(name="faiss.flat", missing=str(e))

    try:
        import sqlite_vec
        db = _sqlite_with_vec(sqlite_vec)
        start = time.perf_counter()
        db.execute(f"CREATE VIRTUAL TABLE items USING vec0(embedding float[{d}])")
        db.execute("BEGIN")
        db.executemany("INSERT INTO items(rowid, embedding) VALUES (?, ?)",
                       ((i + 1, vectors[i].tobytes()) for i in range(n)))
        db.execute("COMMIT")
        build = time.perf_counter() - start
        statement = "SELECT rowid FROM items WHERE embedding MATCH ? AND k = ? ORDER BY distance"
        latencies, answers = timed_queries(
            queries, lambda v: [r[0] - 1 for r in db.execute(statement, (v.tobytes(), k))])
        emit(name="sqlitevec.knn", latencies_us=latencies, ids=answers[:20], build_s=build)
    except ImportError as e:
        emit(name="sqlitevec.knn", missing=str(e))

    if exact is None:
        return
    for name, make in (("hnswlib", _hnswlib), ("faiss.hnsw", _faiss_hnsw)):
        try:
            index, build, memory, search = make(vectors, n, d)
        except ImportError as e:
            emit(name=name, missing=str(e))
            continue
        for ef in (16, 32, 48, 64, 96, 128, 192, 256, 384, 512):
            latencies, answers = timed_queries(queries, lambda v: search(v, ef, k))
            r = recall(answers, exact, k)
            if r >= 0.95 or ef == 512:
                emit(name=name, latencies_us=latencies, recall=r, ef=ef, build_s=build, memory_bytes=memory)
                break


def _sqlite_with_vec(sqlite_vec):
    """An in-memory SQLite connection with sqlite-vec loaded: Python's sqlite3 when it may load extensions (Debian's
    does), else apsw (its own SQLite; `pip install apsw`)."""
    import sqlite3
    db = sqlite3.connect(":memory:", isolation_level=None)
    if hasattr(db, "enable_load_extension"):
        db.enable_load_extension(True)
        sqlite_vec.load(db)
        db.enable_load_extension(False)
        return db
    import apsw
    db = apsw.Connection(":memory:")
    db.enable_load_extension(True)
    db.load_extension(sqlite_vec.loadable_path())
    db.enable_load_extension(False)
    return db


def _hnswlib(vectors, n, d):
    import hnswlib
    start = time.perf_counter()
    index = hnswlib.Index(space="l2", dim=d)
    index.init_index(max_elements=n, M=16, ef_construction=200)
    index.set_num_threads(1)
    index.add_items(vectors)
    build = time.perf_counter() - start
    memory = index.index_file_size() if hasattr(index, "index_file_size") else 0

    def search(v, ef, k):
        index.set_ef(max(ef, k))
        return index.knn_query(v, k=k)[0][0]
    return index, build, memory, search


def _faiss_hnsw(vectors, n, d):
    import faiss
    faiss.omp_set_num_threads(1)
    start = time.perf_counter()
    index = faiss.IndexHNSWFlat(d, 16)
    index.hnsw.efConstruction = 200
    index.add(vectors)
    build = time.perf_counter() - start
    memory = len(faiss.serialize_index(index))

    def search(v, ef, k):
        index.hnsw.efSearch = max(ef, k)
        return index.search(v.reshape(1, d), k)[1][0]
    return index, build, memory, search


if __name__ == "__main__":
    main()
