import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB

/// The peers a database syncs with (SYNC.md §8): addresses it dials, kept across restarts.
extension BlazeDatabase {
    /// Addresses of the peers this database syncs with.
    public func peers() throws -> [String] { try entries("address", of: "sync_peers") }

    /// Adds a peer address; returns false when it was already there.
    public func addPeer(_ address: String) throws -> Bool { try add(address, as: "address", to: "sync_peers") }

    /// Removes a peer address; returns false when it was not there.
    public func removePeer(_ address: String) throws -> Bool {
        try connections.write { db in
            try db.execute(sql: "DELETE FROM sync_peers WHERE address = ?", arguments: [address])
            return db.changesCount > 0
        }
    }

    /// The sync protocol each relay this database dials last answered in, by address (kept across restarts: whether a
    /// relay can carry entries of format 3, SYNC.md §6 "Entry formats").
    public func relayProtocols() throws -> [String: Int] {
        try read { db in
            guard let text = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'relay_protocols'"),
                case .object(let o)? = try? JSONParser().parse(text)
            else { return [:] }
            return o.compactMapValues { v in v.intValue.map { Int(clamping: $0) } }
        }
    }

    /// Records that the relay at `address` answered in protocol `version`; true when that changed what was held.
    @discardableResult
    public func recordRelayProtocol(_ address: String, version: Int) throws -> Bool {
        try connections.write { db in
            var held: [String: JSONValue] = [:]
            if let text = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'relay_protocols'"),
                case .object(let o)? = try? JSONParser().parse(text)
            {
                held = o
            }
            // Only addresses still dialed are kept, so the record stays as small as the peer list.
            let dialed = Set(try String.fetchAll(db, sql: "SELECT address FROM sync_peers"))
            held = held.filter { dialed.contains($0.key) }
            guard held[address] != .int(Int64(version)) else { return false }
            held[address] = .int(Int64(version))
            try db.execute(
                sql: "INSERT INTO meta(key, value) VALUES ('relay_protocols', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                arguments: [JSONValue.object(held).jsonText])
            return true
        }
    }

    /// The values of `column` in `table` (a list of addresses or paths), in order.
    private func entries(_ column: String, of table: String) throws -> [String] {
        try read { db in try String.fetchAll(db, sql: "SELECT \(column) FROM \(table) ORDER BY \(column)") }
    }

    /// Adds `value` to the list `table` (its `column`, with when it was added); false when it was there.
    private func add(_ value: String, as column: String, to table: String) throws -> Bool {
        try connections.write { db in
            try db.execute(
                sql: "INSERT OR IGNORE INTO \(table)(\(column), added_at) VALUES (?, ?)",
                arguments: [value, Int64(Date().timeIntervalSince1970 * 1000)])
            return db.changesCount > 0
        }
    }
}

/// The shared folders a database syncs through (SYNC.md §10).
extension BlazeDatabase {
    /// Paths of the folders this database syncs through.
    public func folders() throws -> [String] { try entries("path", of: "sync_folders") }

    /// Adds a folder; returns false when it was already there.
    public func addFolder(_ path: String) throws -> Bool { try add(path, as: "path", to: "sync_folders") }

    /// Removes a folder and what was seen in it; returns false when it was not there.
    public func removeFolder(_ path: String) throws -> Bool {
        try connections.write { db in
            try db.execute(sql: "DELETE FROM sync_folder_heads WHERE path = ?", arguments: [path])
            try db.execute(sql: "DELETE FROM sync_folders WHERE path = ?", arguments: [path])
            return db.changesCount > 0
        }
    }

    /// The generation of this device's head file in the folder at `path` (0 before the first).
    public func folderGeneration(_ path: String) throws -> UInt64 {
        try read { db in
            UInt64(try Int64.fetchOne(db, sql: "SELECT generation FROM sync_folders WHERE path = ?", arguments: [path]) ?? 0)
        }
    }

    /// Records the generation of this device's head file in the folder at `path`.
    public func setFolderGeneration(_ path: String, _ generation: UInt64) throws {
        try connections.write { db in
            try db.execute(
                sql: "UPDATE sync_folders SET generation = max(generation, ?) WHERE path = ?",
                arguments: [Int64(clamping: generation), path])
        }
    }

    /// The highest generation seen of each writer's head file in the folder at `path`.
    public func folderHeadsSeen(_ path: String) throws -> [NodeID: UInt64] {
        try read { db in
            var out: [NodeID: UInt64] = [:]
            for row in try Row.fetchAll(
                db, sql: "SELECT writer, generation FROM sync_folder_heads WHERE path = ?", arguments: [path])
            {
                let writer: Data = row[0]
                let generation: Int64 = row[1]
                out[NodeID(bytes: Array(writer))] = UInt64(max(0, generation))
            }
            return out
        }
    }

    /// Records that generation `generation` of `writer`'s head file was seen in the folder at `path`.
    public func setFolderHeadSeen(_ path: String, writer: NodeID, generation: UInt64) throws {
        try connections.write { db in
            try db.execute(
                sql: """
                    INSERT INTO sync_folder_heads(path, writer, generation) VALUES (?, ?, ?)
                    ON CONFLICT(path, writer) DO UPDATE SET generation = max(generation, excluded.generation)
                    """,
                arguments: [path, Data(writer.bytes), Int64(clamping: generation)])
        }
    }
}
