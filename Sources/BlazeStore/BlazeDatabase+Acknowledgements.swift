// Members' acknowledgements and the stable vector compaction goes up to (Protocol/SYNC.md §11). Compaction itself
// is in Compaction.swift.

import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB

/// Members' acknowledgements and statements of entry formats (opaque signed bytes; BlazeSync signs and verifies
/// them) and the stable vector.
extension BlazeDatabase {
    /// Every acknowledgement held: node, when issued, bytes.
    public func acknowledgements() throws -> [(node: [UInt8], issuedMs: UInt64, bytes: [UInt8])] {
        try read { db in
            try Row.fetchAll(db, sql: "SELECT node, issued_at, bytes FROM sync_acks ORDER BY node").map { row in
                (Array(row[0] as Data), UInt64(max(0, row[1] as Int64)), Array(row[2] as Data))
            }
        }
    }

    /// Keeps `bytes` as `node`'s acknowledgement unless one issued later is held; true when it was kept.
    public func storeAcknowledgement(node: [UInt8], issuedMs: UInt64, bytes: [UInt8]) throws -> Bool {
        try storeLatest("sync_acks", node: node, issuedMs: issuedMs, bytes: bytes)
    }

    /// Keeps `bytes` as `node`'s row of `table` (a table of signed statements, the latest of each signer) unless one
    /// issued later is held; true when it was kept.
    private func storeLatest(_ table: String, node: [UInt8], issuedMs: UInt64, bytes: [UInt8]) throws -> Bool {
        try connections.write { db in
            try db.execute(
                sql: """
                    INSERT INTO \(table)(node, issued_at, bytes) VALUES (?, ?, ?)
                    ON CONFLICT(node) DO UPDATE SET issued_at = excluded.issued_at, bytes = excluded.bytes
                    WHERE excluded.issued_at > \(table).issued_at
                    """,
                arguments: [Data(node), Int64(clamping: issuedMs), Data(bytes)])
            return db.changesCount > 0
        }
    }

    /// Every statement of entry formats held (opaque signed bytes, the latest of each member; SYNC.md §6).
    public func formatStatements() throws -> [(node: [UInt8], bytes: [UInt8])] {
        try read { db in
            try Row.fetchAll(db, sql: "SELECT node, bytes FROM sync_formats ORDER BY node").map { row in
                (Array(row[0] as Data), Array(row[1] as Data))
            }
        }
    }

    /// Keeps `bytes` as `node`'s statement of entry formats unless one issued later is held; true when it was kept.
    public func storeFormatStatement(node: [UInt8], issuedMs: UInt64, bytes: [UInt8]) throws -> Bool {
        try storeLatest("sync_formats", node: node, issuedMs: issuedMs, bytes: bytes)
    }

    /// True when this database holds an entry (`sync_entries`) of a format past `format` (its first byte).
    public func holdsEntries(newerThan format: UInt8) throws -> Bool {
        try read { db in
            try Bool.fetchOne(
                db, sql: "SELECT EXISTS(SELECT 1 FROM sync_entries WHERE substr(bytes, 1, 1) > ?)", arguments: [Data([format])]) ?? false
        }
    }

    /// The stable vector last used (kept across restarts under `key`; it only grows).
    public func lastStableVector(key: String = "stable_vector") throws -> VersionVector {
        try read { db in
            guard let text = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = ?", arguments: [key]),
                case .object(let o)? = try? JSONParser().parse(text)
            else { return VersionVector() }
            var out: [NodeID: UInt64] = [:]
            for (k, v) in o {
                if let origin = NodeID(hex: k), case .int(let seq) = v, seq > 0 { out[origin] = UInt64(seq) }
            }
            return VersionVector(out)
        }
    }

    /// Records `stable` (merged with the last one: the stable vector only grows) and returns the merge.
    @discardableResult
    public func recordStableVector(_ stable: VersionVector, key: String = "stable_vector") throws -> VersionVector {
        let merged = VersionVector(try lastStableVector(key: key).entries.merging(stable.entries, uniquingKeysWith: max))
        let text = JSONValue.object(Dictionary(uniqueKeysWithValues: merged.entries.map { ($0.key.hex, JSONValue.int(Int64($0.value))) })).jsonText
        try connections.write { db in
            try db.execute(
                sql: "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                arguments: [key, text])
        }
        return merged
    }
}
