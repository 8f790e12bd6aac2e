import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB

/// A database's state as a snapshot carries it (SYNC.md §11), as plain text records, one per line: the first line is
/// `{"h": home, "v": [[origin, seq, hash], …]}` (the author's stamp home, and per origin what the snapshot covers and
/// the hash of that origin's entry there); then `{"c": name}` per collection, `{"i": name, "s": state}` per index
/// definition and `{"d": [collection, id, state, body or null, deleting origin or null, its seq or null]}` per
/// document, live or deleted, its state in the author's storage form.
///
/// Sealing, signing and moving the bytes are BlazeSync's; this side reads them in one transaction and installs them
/// in one transaction.
extension BlazeDatabase {
    /// Reads the state in one read transaction, handing `part` the records in pieces of about `partBytes` bytes, and
    /// returns per origin what the snapshot covers (the applied vector) with the chain head there.
    @discardableResult
    public func exportSnapshot(partBytes: Int = 1 << 20, _ part: ([UInt8]) throws -> Void) throws -> [NodeID: PrunedHead] {
        try read { db in
            let applied = try self.makeStorage(db).versionVector()
            let pruned = try Compactor.prunedHeads(db)
            var heads: [NodeID: PrunedHead] = [:]
            let entry = try db.cachedStatement(sql: "SELECT hash FROM sync_entries WHERE origin = ? AND seq = ?")
            for (origin, seq) in applied.entries {
                if let hash = try Data.fetchOne(entry, arguments: [Data(origin.bytes), Int64(seq)]) {
                    heads[origin] = PrunedHead(seq: seq, hash: Array(hash))
                } else if let p = pruned[origin], p.seq == seq {
                    heads[origin] = p
                } else {
                    // Changes never sealed (a database shared after compaction, or data from before sync): the
                    // origin's chain starts after them.
                    heads[origin] = PrunedHead(seq: seq, hash: PrunedHead.chainStart)
                }
            }
            var buffer: [UInt8] = []
            buffer.reserveCapacity(partBytes + 4096)
            func emit(_ record: JSONValue) throws {
                buffer += record.jsonBytes
                buffer.append(0x0A)
                if buffer.count >= partBytes {
                    try part(buffer)
                    buffer.removeAll(keepingCapacity: true)
                }
            }
            let vector: [JSONValue] = heads.sorted { $0.key < $1.key }.map { origin, head in
                [.string(origin.hex), .int(Int64(head.seq)), .string(hexString(head.hash))]
            }
            let dropped = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'tombstone_cl_floor'").flatMap { Int64($0) } ?? 0
            try emit(["h": self.coding.home.map { .string($0.hex) } ?? .null, "v": .array(vector), "f": .int(dropped)])
            for name in try String.fetchAll(db, sql: "SELECT name FROM collections ORDER BY name") { try emit(["c": .string(name)]) }
            for row in try Row.fetchAll(db, sql: "SELECT name, state FROM index_states ORDER BY name") {
                try emit(["i": .string(row[0]), "s": .string(row[1])])
            }
            for sql in [
                "SELECT collection, id, state, body, NULL, NULL FROM docs WHERE state IS NOT NULL",
                "SELECT collection, id, state, NULL, del_origin, del_seq FROM tombstones",
            ] {
                let rows = try Row.fetchCursor(db, sql: sql)
                while let row = try rows.next() {
                    let body: String? = row[3], delOrigin: String? = row[4], delSeq: Int64? = row[5]
                    try emit([
                        "d": [
                            .string(row[0]), .string(row[1]), .string(row[2]), body.map(JSONValue.string) ?? .null,
                            delOrigin.map(JSONValue.string) ?? .null, delSeq.map(JSONValue.int) ?? .null,
                        ]
                    ])
                }
            }
            if !buffer.isEmpty { try part(buffer) }
            return heads
        }
    }

    /// Replaces this replica's state with a snapshot's, in one write transaction: `parts` yields the records (in
    /// the pieces `exportSnapshot` made; nil after the last) and `heads` is what the snapshot covers per origin
    /// (already checked against its signed manifest). The changes this replica holds beyond it — its own not yet
    /// sealed, and those of its held entries past the snapshot, which `openEntry` decrypts — are applied again on
    /// top, in the same transaction. Every record is validated like a backup's rows; anything malformed or out of
    /// bounds throws `StoreError` (`bad_snapshot`) and changes nothing.
    ///
    /// Afterwards the origins' chains continue from `heads` (`sync_pruned`), entries the snapshot covers are
    /// dropped, and the feed starts again after its last sequence: subscribers must read the state again.
    public func installSnapshot(
        heads: [NodeID: PrunedHead], signedHeads: [(origin: NodeID, seq: UInt64, bytes: [UInt8])] = [], parts: () throws -> [UInt8]?,
        openEntry: ([UInt8]) throws -> Change
    ) throws -> ReceiveReport {
        let feed = self.feed
        return try connections.write { db in
            func bad(_ what: String) -> StoreError { StoreError.invalid("bad_snapshot", "the snapshot holds \(what)") }
            // A chain head must agree with the entry held here at that place.
            for (origin, head) in heads {
                if let held = try Data.fetchOne(
                    db, sql: "SELECT hash FROM sync_entries WHERE origin = ? AND seq = ?", arguments: [Data(origin.bytes), Int64(head.seq)]),
                    Array(held) != head.hash
                {
                    throw bad("a chain head of \(origin) at \(head.seq) that differs from the entry held here")
                }
            }
            // What this replica holds beyond the snapshot is applied again on top of it.
            var replay: [Change] = []
            var replayed = Set<Dot>()
            for body in try String.fetchAll(db, sql: "SELECT body FROM changes") {
                let change = try Change(json: try JSONParser(maxDepth: 10_000).parse(body))
                if change.seq > heads[change.origin]?.seq ?? 0, replayed.insert(Dot(origin: change.origin, seq: change.seq, index: 0)).inserted {
                    replay.append(change)
                }
            }
            let entries = try Row.fetchCursor(db, sql: "SELECT origin, seq, bytes FROM sync_entries")
            while let row = try entries.next() {
                let origin = NodeID(bytes: Array(row[0] as Data)), seq = UInt64(max(0, row[1] as Int64))
                guard seq > heads[origin]?.seq ?? 0, !replayed.contains(Dot(origin: origin, seq: seq, index: 0)) else { continue }
                let change = try openEntry(Array(row[2] as Data))
                try self.validate(change)
                replayed.insert(Dot(origin: origin, seq: seq, index: 0))
                replay.append(change)
            }
            // What the replica held goes: the snapshot is the state up to `heads`, the replay what follows.
            for name in try String.fetchAll(db, sql: "SELECT name FROM indexes") {
                try db.execute(sql: "DROP INDEX IF EXISTS \(WriteTransaction.sqlIndexName(name))")
            }
            try VectorIndexSQL.dropAll(in: db)
            try db.execute(
                sql: """
                    DELETE FROM docs; DELETE FROM tombstones; DELETE FROM collections; DELETE FROM indexes;
                    DELETE FROM index_states; DELETE FROM versions; DELETE FROM changes;
                    """)
            let storage = self.makeStorage(db)
            var home: StampCoding?
            var seenHeads: [NodeID: PrunedHead]?
            let now = Self.nowMilliseconds()
            let latestClock = HLC(milliseconds: now + self.limits.maxClockAheadMilliseconds)
            let insertDoc = try db.cachedStatement(
                sql: "INSERT INTO docs(collection, id, body, state, conflicted) VALUES (?, ?, ?, ?, ?)")
            let insertTombstone = try db.cachedStatement(
                sql: "INSERT INTO tombstones(collection, id, state, del_origin, del_seq) VALUES (?, ?, ?, ?, ?)")
            let insertCollection = try db.cachedStatement(
                sql: "INSERT OR IGNORE INTO collections(name, created_at) VALUES (?, ?)")
            var indexes: [(String, IndexState)] = []
            var newest = HLC(raw: 0)
            while let bytes = try parts() {
                for line in bytes.split(separator: 0x0A, omittingEmptySubsequences: true) {
                    guard case .object(let record)? = try? JSONParser(maxDepth: self.limits.maxDepth + 8).parse(
                        String(decoding: line, as: UTF8.self))
                    else { throw bad("a malformed record") }
                    if home == nil {
                        guard let h = record["h"], case .array(let v)? = record["v"], case .int(let dropped)? = record["f"], dropped >= 0,
                            dropped % 2 == 0, dropped < ChangeBounds.maxCausalLength
                        else { throw bad("no header first") }
                        // The author dropped tombstones up to this causal length: so does this replica, in effect.
                        try self.compactor.raiseDroppedCausalLength(dropped, db)
                        var node: NodeID?
                        if case .string(let text) = h {
                            guard let n = NodeID(hex: text) else { throw bad("a malformed header") }
                            node = n
                        } else if h != .null {
                            throw bad("a malformed header")
                        }
                        var parsed: [NodeID: PrunedHead] = [:]
                        for item in v {
                            guard case .array(let a) = item, a.count == 3, case .string(let o) = a[0], let origin = NodeID(hex: o),
                                case .int(let seq) = a[1], seq > 0, SyncBounds.isValidSeq(UInt64(seq)), case .string(let hx) = a[2],
                                let hash = hexBytes(hx), hash.count == 32, parsed[origin] == nil
                            else { throw bad("a malformed header") }
                            parsed[origin] = PrunedHead(seq: UInt64(seq), hash: hash)
                        }
                        guard parsed == heads else { throw bad("a header that is not the one its author signed") }
                        home = StampCoding(home: node)
                        seenHeads = parsed
                        continue
                    }
                    if case .string(let name)? = record["c"], record.count == 1 {
                        guard (try? Names.validateCollection(name)) != nil else { throw bad("an invalid collection name") }
                        try insertCollection.execute(arguments: [name, Int64(now)])
                    } else if case .string(let name)? = record["i"], case .string(let text)? = record["s"], record.count == 2 {
                        guard (try? Names.validateIndex(name)) != nil, case .object(let o)? = try? JSONParser(maxDepth: 8).parse(text),
                            let stamp = o["s"].flatMap({ Stamp(json: $0) }), stamp.hlc.raw < ChangeBounds.maxClock,
                            case .string(let collection)? = o["c"], (try? Names.validateCollection(collection)) != nil
                        else { throw bad("an invalid index definition") }
                        let fields = o["f"]?.arrayValue?.compactMap(\.stringValue)
                        let vector = o["v"].map(IndexVector.init(json:))
                        indexes.append((name, IndexState(stamp: stamp, collection: collection, fields: fields, vector: vector)))
                    } else if case .array(let d)? = record["d"], d.count == 6, record.count == 1, let coding = home {
                        guard case .string(let collection) = d[0], case .string(let id) = d[1], case .string(let stateText) = d[2],
                            (try? Names.validateCollection(collection)) != nil, (try? Names.validateID(id)) != nil
                        else { throw bad("an invalid document name") }
                        var body: String?
                        if case .string(let b) = d[3] { body = b }
                        guard let state = try? SQLStorage.decode(state: stateText, body: body, coding), state.maxClock <= latestClock,
                            state.isAlive == (body != nil)
                        else { throw bad("an invalid state for \(Names.quoted(id)) of \(Names.quoted(collection))") }
                        let stored = state.compactText(self.coding)
                        try insertCollection.execute(arguments: [collection, Int64(now)])
                        if let doc = state.materialize(id: id) {
                            let text = JSONValue.object(doc).jsonText
                            guard text.utf8.count <= self.limits.maxDocumentBytes + 4096 else { throw bad("a document over the size limit") }
                            try insertDoc.execute(arguments: [collection, id, text, stored, state.hasConflicts])
                        } else {
                            var by: (String, Int64)?
                            if case .string(let o) = d[4], NodeID(hex: o) != nil, case .int(let s) = d[5], s > 0 { by = (o, s) }
                            try insertTombstone.execute(arguments: [collection, id, stored, by?.0, by?.1])
                        }
                        newest = max(newest, state.maxClock)
                    } else {
                        throw bad("an unknown record")
                    }
                }
            }
            guard let installed = seenHeads else { throw bad("no header") }
            for (name, state) in indexes { try storage.saveIndex(name, state) }
            let versions = try db.cachedStatement(sql: "INSERT INTO versions(origin, seq) VALUES (?, ?)")
            for (origin, head) in installed {
                let o = Data(origin.bytes)
                try versions.execute(arguments: [origin.hex, Int64(head.seq)])
                // Changes parked here that the snapshot covers are in it already.
                try db.execute(sql: "DELETE FROM parked WHERE origin = ? AND seq <= ?", arguments: [origin.hex, Int64(head.seq)])
                try db.execute(
                    sql: "INSERT INTO sync_pruned(origin, seq, hash) VALUES (?, ?, ?) ON CONFLICT(origin) DO UPDATE SET seq = excluded.seq, hash = excluded.hash",
                    arguments: [o, Int64(head.seq), Data(head.hash)])
                try db.execute(sql: "DELETE FROM sync_entries WHERE origin = ? AND seq <= ?", arguments: [o, Int64(head.seq)])
                try db.execute(
                    sql: "DELETE FROM sync_heads WHERE origin = ?1 AND seq <= ?2 AND seq < (SELECT max(seq) FROM sync_heads WHERE origin = ?1)",
                    arguments: [o, Int64(head.seq)])
            }
            // The heads origins signed over the entries the snapshot ends at (checked by the caller): what proves a
            // cutoff when this replica removes one of them.
            for head in signedHeads where installed[head.origin]?.seq == head.seq {
                try db.execute(
                    sql: "INSERT OR IGNORE INTO sync_heads(origin, seq, head) VALUES (?, ?, ?)",
                    arguments: [Data(head.origin.bytes), Int64(head.seq), Data(head.bytes)])
            }
            // The feed's rows describe the replaced state: it starts again after its last sequence.
            let last = max(feed.lastSequence, try Int64.fetchOne(db, sql: "SELECT max(seq) FROM feed") ?? 0)
            let total = feed.totals.last
            try db.execute(sql: "DELETE FROM feed")
            try db.execute(
                sql: "INSERT INTO meta(key, value) VALUES ('feed_floor', ?), ('feed_floor_total', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                arguments: [String(last), String(total)])
            let committedVersions = self.committedVersions
            db.afterNextTransaction(onCommit: { _ in
                committedVersions.forget()
                feed.raiseFloor(last, total: total)
                feed.reset(StoreError(.unavailable, kind: "snapshot_installed", "the database's state was replaced by a snapshot; read it again"))
            })
            let report = try self.receive(replay, in: db)
            try Self.analyze(db)
            // The clock moves past every stamp installed (were the install rolled back, it would only be ahead).
            self.clock.withLock { _ = $0.observe(newest, now: now) }
            return report
        }
    }
}
