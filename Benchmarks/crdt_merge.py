#!/usr/bin/env python3
"""How fast in-memory CRDT libraries apply remote updates one at a time, for comparison with blazebench W4 and W6.

The shapes follow W4 and W6: `inserts` new ~250-byte documents (6 fields, a map per document under a root map keyed by
id), one update per document; then `updates` single-field updates (`score` and `name` set) over the first `docs`
documents, one update each. A source replica makes the updates and records each one's bytes; a second replica applies
them one at a time, and only that is timed. In memory, not persisted, not encrypted: what blazed does per change on
top of this (decrypt, verify, persist, index, feed) is its own.

Run by `make bench-peers` in a throwaway venv (`pip install pycrdt loro`); prints one line per library and shape.
"""

import sys
import time


def document(i):
    return {
        "name": f"user number {i} with a longer display name",
        "email": f"user{i}@example.com",
        "age": i % 90,
        "score": i * 1.25,
        "tags": ["alpha", "beta", f"t{i % 17}"],
        "bio": "x" * 70,
    }


def bench_pycrdt(inserts, docs, updates):
    import pycrdt

    source = pycrdt.Doc()
    root = source.get("root", type=pycrdt.Map)
    recorded = []
    source.observe(lambda event: recorded.append(event.update))
    for i in range(inserts):
        d = document(i)
        d["tags"] = pycrdt.Array(d["tags"])
        root[f"doc-{i:08d}"] = pycrdt.Map(d)
    created = list(recorded)
    recorded.clear()
    for k in range(updates):
        entry = root[f"doc-{k % docs:08d}"]
        with source.transaction():
            entry["score"] = float(k)
            entry["name"] = f"n-{k}"
    changed = list(recorded)
    return apply_all(lambda: pycrdt.Doc(), lambda doc, u: doc.apply_update(u), created, changed)


def bench_loro(inserts, docs, updates):
    import loro

    source = loro.LoroDoc()
    root = source.get_map("root")
    recorded = []
    subscription = source.subscribe_local_update(lambda update: recorded.append(bytes(update)) or True)
    entries = []
    for i in range(inserts):
        entry = root.insert_container(f"doc-{i:08d}", loro.LoroMap())
        if i < docs:
            entries.append(entry)
        for key, value in document(i).items():
            if isinstance(value, list):
                tags = entry.insert_container(key, loro.LoroList())
                for t in value:
                    tags.push(t)
            else:
                entry.insert(key, value)
        source.commit()
    created = list(recorded)
    recorded.clear()
    for k in range(updates):
        entry = entries[k % docs]
        entry.insert("score", float(k))
        entry.insert("name", f"n-{k}")
        source.commit()
    changed = list(recorded)
    del subscription
    return apply_all(lambda: loro.LoroDoc(), lambda doc, u: doc.import_(u), created, changed)


def apply_all(make, apply, created, changed):
    """Applies the recorded inserts to a fresh replica, then the updates; returns both rates (updates/s)."""
    target = make()
    start = time.perf_counter()
    for u in created:
        apply(target, u)
    insert_rate = len(created) / (time.perf_counter() - start)
    start = time.perf_counter()
    for u in changed:
        apply(target, u)
    update_rate = len(changed) / (time.perf_counter() - start)
    return insert_rate, update_rate


def main():
    inserts = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    docs = min(inserts, 10_000)
    updates = int(sys.argv[2]) if len(sys.argv) > 2 else 50_000
    for name, bench in (("pycrdt", bench_pycrdt), ("loro", bench_loro)):
        try:
            insert_rate, update_rate = bench(inserts, docs, updates)
        except ImportError as e:
            print(f"{name}: not installed ({e})")
            continue
        print(f"{name}: W4 shape {insert_rate:,.0f} inserts/s applied one at a time ({inserts:,}); "
              f"W6 shape {update_rate:,.0f} updates/s ({updates:,} over {docs:,} documents)")


if __name__ == "__main__":
    main()
