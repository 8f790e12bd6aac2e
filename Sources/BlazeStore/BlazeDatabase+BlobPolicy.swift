import BlazeProtocol
import Foundation
import GRDB

/// Which blobs this device fetches before they are read (ARCHITECTURE.md, "Blobs", "Fetching eagerly"): those of the
/// documents of some collections, up to a size, and those pinned one by one. Both are this device's choice: kept in
/// its database file (`meta` and `blob_pins`), never synced.
public struct BlobPolicy: Sendable, Equatable {
    /// The collections whose documents' blobs are fetched as the documents arrive; `["*"]` is every collection.
    public var eager: [String]
    /// The largest blob fetched eagerly, in bytes (nil: any size up to the daemon's blob limit).
    public var maxBytes: Int?

    /// A policy fetching the blobs of `eager`'s collections of at most `maxBytes` bytes.
    public init(eager: [String] = [], maxBytes: Int? = nil) {
        self.eager = eager
        self.maxBytes = maxBytes
    }

    /// Whether documents of `collection` have their blobs fetched eagerly.
    public func isEager(_ collection: String) -> Bool { eager.contains("*") || eager.contains(collection) }

    /// Whether a blob of `size` bytes (as its reference or manifest says) is small enough to fetch eagerly.
    public func admits(size: Int) -> Bool { maxBytes.map { size <= $0 } ?? true }

    /// The policy as stored in `meta`.
    var text: String {
        var object: [String: JSONValue] = ["eager": .array(eager.map { .string($0) })]
        if let maxBytes { object["maxBytes"] = .int(Int64(maxBytes)) }
        return JSONValue.object(object).jsonText
    }

    /// The policy stored as `text`; a damaged value is no policy (nothing fetched eagerly).
    init(text: String) {
        guard let object = (try? JSONParser(maxDepth: 3).parse(Array(text.utf8)))?.objectValue else {
            self.init()
            return
        }
        let eager = object["eager"]?.arrayValue?.compactMap(\.stringValue).filter { $0 == "*" || (try? Names.validateCollection($0)) != nil }
        let maxBytes = object["maxBytes"]?.intValue.flatMap { $0 >= 0 ? Int($0) : nil }
        self.init(eager: eager ?? [], maxBytes: maxBytes)
    }
}

/// A blob reference found in a document: `{"$blob": {"id": …, "size": …, "type": …}}`. The size and type are what
/// the document's writer claims; the manifest is what counts.
public struct BlobReference: Sendable, Hashable {
    /// The blob's id.
    public let id: ChunkID
    /// The size the reference claims, in bytes (0 when it claims none or a negative one).
    public let size: Int
    /// The media type the reference claims.
    public let type: String?

    /// The references in a document's text, in document order, each once.
    public static func all(inDocument text: String) -> [BlobReference] {
        guard text.contains("$blob"), let value = try? JSONParser().parse(Array(text.utf8)) else { return [] }
        var out: [BlobReference] = []
        var seen = Set<ChunkID>()
        collect(value, into: &out, seen: &seen)
        return out
    }

    private static func collect(_ value: JSONValue, into out: inout [BlobReference], seen: inout Set<ChunkID>) {
        switch value {
        case .object(let object):
            if let ref = object["$blob"]?.objectValue, let hex = ref["id"]?.stringValue, let id = ChunkID(hex: hex) {
                if seen.insert(id).inserted {
                    let size = ref["size"]?.intValue.map { Int(clamping: max(0, $0)) } ?? 0
                    out.append(BlobReference(id: id, size: size, type: ref["type"]?.stringValue))
                }
                return
            }
            for (_, child) in object { collect(child, into: &out, seen: &seen) }
        case .array(let items):
            for child in items { collect(child, into: &out, seen: &seen) }
        default:
            break
        }
    }
}

extension BlazeDatabase {
    /// This device's blob policy (no collection eager when none was set).
    public func blobPolicy() throws -> BlobPolicy {
        try read { db in
            try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'blob_policy'").map(BlobPolicy.init(text:)) ?? BlobPolicy()
        }
    }

    /// Replaces this device's blob policy.
    public func setBlobPolicy(_ policy: BlobPolicy) throws {
        try connections.write { db in
            try db.execute(
                sql: "INSERT INTO meta(key, value) VALUES ('blob_policy', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                arguments: [policy.text])
        }
    }

    /// Pins blob `id` on this device (fetched and kept whatever refers to it); false when it was pinned already.
    @discardableResult
    public func pinBlob(_ id: ChunkID) throws -> Bool {
        try connections.write { db in
            try db.execute(
                sql: "INSERT OR IGNORE INTO blob_pins(id, pinned_at) VALUES (?, ?)",
                arguments: [id.hex, Int64(Date().timeIntervalSince1970 * 1000)])
            return db.changesCount > 0
        }
    }

    /// Unpins blob `id`; false when it was not pinned.
    @discardableResult
    public func unpinBlob(_ id: ChunkID) throws -> Bool {
        try connections.write { db in
            try db.execute(sql: "DELETE FROM blob_pins WHERE id = ?", arguments: [id.hex])
            return db.changesCount > 0
        }
    }

    /// The blobs pinned on this device (a row that does not name a blob, from a damaged or hostile backup, is skipped).
    public func pinnedBlobs() throws -> Set<ChunkID> {
        try read { db in Set(try String.fetchAll(db, sql: "SELECT id FROM blob_pins").compactMap(ChunkID.init(hex:))) }
    }

    /// The blobs the live documents refer to, with the collections they are referred to from, read from a snapshot.
    /// Each document's text is parsed once; documents that do not mention `$blob` are not read.
    public func documentBlobReferences() throws -> [(collection: String, reference: BlobReference)] {
        try read { db in try Self.documentBlobReferences(db) }
    }

    /// `documentBlobReferences()`, read from `db`.
    static func documentBlobReferences(_ db: Database) throws -> [(collection: String, reference: BlobReference)] {
        var out: [(String, BlobReference)] = []
        let rows = try Row.fetchCursor(db, sql: "SELECT collection, body FROM docs WHERE instr(body, '$blob') > 0")
        while let row = try rows.next() {
            let collection: String = row[0]
            let body: String = row[1]
            for reference in BlobReference.all(inDocument: body) { out.append((collection, reference)) }
        }
        return out
    }
}
