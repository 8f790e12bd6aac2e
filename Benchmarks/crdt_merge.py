#!/usr/bin/env python3
"""How fast in-memory CRDT libraries apply remote updates one at a time, for comparison with blazebench W4 and W6.

The shapes follow W4 and W6: `inserts` new ~250-byte documents (6 fields, a map per document under a root map keyed by
id), one update per document; then `updates` two-field updates (`score` and `name` set) over the first `docs`
documents, one update each. A source replica makes the updates and records each one's bytes; a second replica applies
them one at a time, and only that is timed. In memory, not persisted, not encrypted: what blazed does per change on
top of this (decrypt, verify, persist, index, feed) is its own.

W6 itself is two-way: two replicas that hold the same `docs` documents each make `updates` such updates offline, then
each applies the other's, one at a time, so every update meets a concurrent one of the same fields. The "W6 both ways"
figure times that: 2 × `updates` changes over the two replicas' apply times added up (one core; blazed uses two), and
checks that both replicas end equal. It is timed twice, on fresh replicas: one update at a time, and in batches of
1,000 (as blazed's peers send them: `import_batch` for loro, `merge_updates` then one apply for pycrdt).

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


def loro_document(loro, root, i):
    """Inserts document `i` into loro map `root` as a map (its tags a list); returns the document's map."""
    entry = root.insert_container(f"doc-{i:08d}", loro.LoroMap())
    for key, value in document(i).items():
        if isinstance(value, list):
            tags = entry.insert_container(key, loro.LoroList())
            for t in value:
                tags.push(t)
        else:
            entry.insert(key, value)
    return entry


def bench_loro(inserts, docs, updates):
    import loro

    source = loro.LoroDoc()
    root = source.get_map("root")
    recorded = []
    subscription = source.subscribe_local_update(lambda update: recorded.append(bytes(update)) or True)
    entries = []
    for i in range(inserts):
        entry = loro_document(loro, root, i)
        if i < docs:
            entries.append(entry)
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


def both_ways_pycrdt(docs, updates):
    import pycrdt

    base = pycrdt.Doc()
    root = base.get("root", type=pycrdt.Map)
    for i in range(docs):
        d = document(i)
        d["tags"] = pycrdt.Array(d["tags"])
        root[f"doc-{i:08d}"] = pycrdt.Map(d)
    state = base.get_update()

    def offline(tag):
        replica = pycrdt.Doc()
        replica.apply_update(state)
        m = replica.get("root", type=pycrdt.Map)
        recorded = []
        subscription = replica.observe(lambda event: recorded.append(event.update))
        for k in range(updates):
            entry = m[f"doc-{k % docs:08d}"]
            with replica.transaction():
                entry["score"] = float(k)
                entry["name"] = f"{tag}-{k}"
        replica.unobserve(subscription)
        return replica, recorded

    def run(apply, batched):
        (a, made_a), (b, made_b) = offline("a"), offline("b")
        rate = two_way(a, b, made_a, made_b, apply, batched)
        return rate, a.get("root", type=pycrdt.Map).to_py() == b.get("root", type=pycrdt.Map).to_py()

    one = run(lambda doc, u: doc.apply_update(u), batched=False)
    return one, run(lambda doc, us: doc.apply_update(pycrdt.merge_updates(*us)), batched=True)


def both_ways_loro(docs, updates):
    import loro

    base = loro.LoroDoc()
    root = base.get_map("root")
    for i in range(docs):
        loro_document(loro, root, i)
    base.commit()
    state = base.export(loro.ExportMode.Snapshot())

    def offline(tag):
        replica = loro.LoroDoc()
        replica.import_(state)
        m = replica.get_map("root")
        entries = [m.get(f"doc-{k:08d}").container for k in range(docs)]
        recorded = []
        subscription = replica.subscribe_local_update(lambda update: recorded.append(bytes(update)) or True)
        for k in range(updates):
            entry = entries[k % docs]
            entry.insert("score", float(k))
            entry.insert("name", f"{tag}-{k}")
            replica.commit()
        del subscription
        return replica, recorded

    def run(apply, batched):
        (a, made_a), (b, made_b) = offline("a"), offline("b")
        rate = two_way(a, b, made_a, made_b, apply, batched)
        return rate, a.get_deep_value() == b.get_deep_value()

    return run(lambda doc, u: doc.import_(u), batched=False), run(lambda doc, us: doc.import_batch(us), batched=True)


def two_way(a, b, made_a, made_b, apply, batched):
    """Applies each replica's updates to the other (`apply` takes one update, or a list of 1,000 when `batched`);
    returns updates per second of both apply times added up."""
    elapsed = 0.0
    for replica, updates in ((a, made_b), (b, made_a)):
        units = [updates[i:i + 1000] for i in range(0, len(updates), 1000)] if batched else updates
        start = time.perf_counter()
        for unit in units:
            apply(replica, unit)
        elapsed += time.perf_counter() - start
    return (len(made_a) + len(made_b)) / elapsed


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
    libraries = (("pycrdt", bench_pycrdt, both_ways_pycrdt), ("loro", bench_loro, both_ways_loro))
    for name, bench, both_ways in libraries:
        try:
            insert_rate, update_rate = bench(inserts, docs, updates)
            (one, same_one), (batched, same_batched) = both_ways(docs, updates)
        except ImportError as e:
            print(f"{name}: not installed ({e})")
            continue
        if not (same_one and same_batched):
            sys.exit(f"{name}: the two replicas differ after W6 both ways")
        print(f"{name}: W4 shape {insert_rate:,.0f} inserts/s applied one at a time ({inserts:,}); "
              f"W6 shape {update_rate:,.0f} updates/s ({updates:,} over {docs:,} documents); "
              f"W6 both ways {one:,.0f} updates/s applied one at a time, {batched:,.0f} in batches of 1,000 "
              f"(2 × {updates:,} concurrent; replicas equal)")


if __name__ == "__main__":
    main()
