import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeWire
import Foundation
import Synchronization

/// A snapshot being received (SYNC.md §11): its manifest, accepted before any piece, and the opened records of the
/// pieces so far, in a staging file beside the database (`BlazeDatabase.snapshotStagingPrefix`), never in memory.
///
/// Each piece is checked as it comes: its index is the next one, it names the hash of the piece before, there are no
/// more than the manifest counts, their bytes stay within the manifest's declared size, and the last one's hash is the
/// one the manifest names. The file is removed when the install ends, when the session ends, and at the database's
/// next open after a crash. Its declared size stays reserved in the engine's `stagingBudget` (per database and in all)
/// until then, so sessions together stage a bounded amount on disk.
final class SnapshotStaging: Sendable {
    /// The accepted manifest.
    let manifest: SnapshotManifest
    /// The staging file.
    let path: String
    private let budget: MemoryBudget
    private let budgetKey: String
    private struct State {
        var file: FileHandle?
        var next: UInt32 = 0
        var last = SealedEntry.genesis
        var bytes: UInt64 = 0
        /// Whether the declared size is still reserved in the budget.
        var reserved = true
    }
    private let state: Mutex<State>

    /// Reserves `manifest`'s declared size in `budget` (for `db`) and creates an empty staging file beside `db`'s
    /// file; throws `StagingFull` when the budget has no room.
    init(manifest: SnapshotManifest, db: BlazeDatabase, budget: MemoryBudget) throws {
        self.manifest = manifest
        self.budget = budget
        budgetKey = db.name
        path = db.path + BlazeDatabase.snapshotStagingPrefix + UUID().uuidString
        guard budget.reserve(Int(manifest.size), for: budgetKey) else { throw StagingFull() }
        guard FileManager.default.createFile(atPath: path, contents: nil, attributes: [.posixPermissions: 0o600]),
            let file = FileHandle(forWritingAtPath: path)
        else {
            budget.release(Int(manifest.size), for: budgetKey)
            throw StagingFailure(path: path)
        }
        state = Mutex(State(file: file))
    }

    /// Whether every piece the manifest counts came (and the last is the one it names).
    var complete: Bool { state.withLock { $0.next == manifest.parts } }

    /// Checks `part` against the pieces before it and the manifest, opens it with `key` and appends its records to the
    /// file. `badSnapshot` for a piece out of place or beyond what the manifest declares.
    func append(_ part: SnapshotPart, key: SpaceKey) throws {
        let (next, last, bytes) = state.withLock { ($0.next, $0.last, $0.bytes) }
        guard next < manifest.parts, part.index == next, part.prev == last,
            bytes + UInt64(part.bytes.count) <= manifest.size
        else { throw SyncRejection.badSnapshot }
        if next + 1 == manifest.parts {
            guard part.hash == manifest.lastPart, bytes + UInt64(part.bytes.count) == manifest.size else {
                throw SyncRejection.badSnapshot
            }
        }
        let records = try part.open(with: key)
        var framed: [UInt8] = []
        framed.reserveCapacity(records.count + 4)
        framed.appendBE(UInt32(records.count))
        framed += records
        try state.withLock { state in
            guard let file = state.file else { throw StagingFailure(path: path) }
            try file.write(contentsOf: framed)
            state.next += 1
            state.last = part.hash
            state.bytes += UInt64(part.bytes.count)
        }
    }

    /// Reads the staged records back one piece at a time, in order: nil after the last. Call once, when `complete`.
    func reader() throws -> () throws -> [UInt8]? {
        guard complete, let file = FileHandle(forReadingAtPath: path) else { throw StagingFailure(path: path) }
        var left = manifest.parts
        let path = self.path
        return {
            guard left > 0 else {
                try? file.close()
                return nil
            }
            left -= 1
            guard let head = try file.read(upToCount: 4), head.count == 4 else { throw StagingFailure(path: path) }
            let count = head.reduce(0) { $0 << 8 | Int($1) }
            guard count <= SnapshotPart.maxBytes, let body = try file.read(upToCount: count) ?? (count == 0 ? Data() : nil),
                body.count == count
            else { throw StagingFailure(path: path) }
            return Array(body)
        }
    }

    /// Closes and deletes the staging file and gives its reservation back (again: nothing happens).
    func remove() {
        let (file, reserved) = state.withLock { state -> (FileHandle?, Bool) in
            defer { (state.file, state.reserved) = (nil, false) }
            return (state.file, state.reserved)
        }
        try? file?.close()
        try? FileManager.default.removeItem(atPath: path)
        if reserved { budget.release(Int(manifest.size), for: budgetKey) }
    }
}

/// The staging file of a snapshot being received could not be written or read back.
struct StagingFailure: Error, CustomStringConvertible {
    let path: String
    var description: String { "the snapshot staging file \(path) could not be written or read" }
}

/// Sessions together stage as many snapshot bytes on disk as the engine allows (`SyncEngine.stagingBudget`): one more
/// must wait for a later session.
struct StagingFull: Error, CustomStringConvertible {
    var description: String { "other sessions stage as many snapshot bytes as this device allows; a later session takes this one" }
}
