import BlazeProtocol
import GRDB

/// The blobs a database refers to, for sweeping its chunk store (ARCHITECTURE.md, "Blobs", "Collecting chunks").
extension BlazeDatabase {
    /// The places a blob reference (`{"$blob": {"id": …}}`) can be held: documents, their replicated state (conflict
    /// losers too) and that of deleted ones until compaction drops it, the changes held as history, changes waiting
    /// for their dependencies, and the feed's events (`doc.history`, `doc.get` at a time).
    static let blobReferencePlaces = [
        ("docs", "body"), ("docs", "state"), ("tombstones", "state"), ("changes", "body"), ("parked", "body"), ("feed", "events"),
    ]

    /// Runs `body` with every blob id the database may refer to, while holding its writer.
    ///
    /// The ids are each run of exactly 64 lowercase hex digits in a row that mentions `$blob`, wherever a reference
    /// can be held (`blobReferencePlaces`), and the blobs pinned here: more than the references, never fewer. No commit, local or from a peer,
    /// adds a reference before `body` returns, so a sweep that removes what `body` was given not to keep cannot race
    /// a document that starts referring to it.
    public func withReferencedBlobs<T>(_ body: (Set<ChunkID>) throws -> T) throws -> T {
        try connections.writeWithoutTransaction { db in try body(try Self.referencedBlobs(db)) }
    }

    /// The blob ids `db` may refer to (see `withReferencedBlobs`).
    static func referencedBlobs(_ db: Database) throws -> Set<ChunkID> {
        var out = Set<ChunkID>()
        for (table, column) in blobReferencePlaces {
            let rows = try String.fetchCursor(db, sql: "SELECT \(column) FROM \(table) WHERE instr(\(column), '$blob') > 0")
            while let text = try rows.next() { collectHexIDs(in: text, into: &out) }
        }
        // Pinned blobs are kept whatever refers to them (`blob.pin`).
        for hex in try String.fetchAll(db, sql: "SELECT id FROM blob_pins") { if let id = ChunkID(hex: hex) { out.insert(id) } }
        return out
    }

    /// Adds to `out` each run of exactly 64 lowercase hex digits in `text`.
    static func collectHexIDs(in text: String, into out: inout Set<ChunkID>) {
        var utf8 = Array(text.utf8)
        utf8.append(0)
        var start = -1
        for (i, c) in utf8.enumerated() {
            let hex = (c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66)
            if hex {
                if start < 0 { start = i }
            } else {
                if start >= 0, i - start == 64, let id = ChunkID(hex: String(decoding: utf8[start..<i], as: UTF8.self)) { out.insert(id) }
                start = -1
            }
        }
    }
}
