import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeWire
import Foundation
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Writing a folder: what it lacks, appended to this device's segment, then its head and members files; and removing
/// what every reader holds.
extension FolderWorker {
    /// Appends every entry held here that the folder lacks to this device's own segment, makes it durable, then
    /// replaces the head file; writes the members file when the log grew.
    func publish() throws {
        let snapshot = space.snapshot
        try db.sealLocal(key: snapshot.key, identity: engine.identity, membership: snapshot.membership)
        held = try db.syncVector()
        let stable = floor(snapshot)
        let folder = coverage(floor: stable)
        var sent = 0
        for (origin, seq) in held.sorted(by: { $0.key < $1.key }) {
            var after = folder[origin] ?? 0
            while seq > after, !control.stopping.load(ordering: .acquiring),
                let batch = try db.entryBatch(origin: origin, after: after, maxEntries: SyncSession.batchEntries)
            {
                let body = try PeerMessage.entries(batch).encoded()
                guard body.count <= FolderFiles.maxRecordBody else { break }
                try append(FolderFiles.record(body))
                sent += batch.entries.count
                after = batch.head.seq
            }
        }
        if sent > 0, let segment {
            try segment.sync()
            try writeHead()
            report.update {
                $0.sentEntries += sent
                $0.lastSyncMs = nowMs()
            }
        } else if generation == 0 || !exists(at: ownFD, "head")
            || (held != headHeld && uptimeMs() >= headWrittenAt + 1000)
        {
            // What it holds changed (received entries): others learn it, at most once a second, so that entries
            // every member holds can be removed.
            try writeHead()
        }
        try writeMembers(snapshot)
        try writeAcks(snapshot)
        try writeFormats(snapshot)
        prune(below: stable)
    }

    /// For each origin, the highest seq every current member holds, as their head files in this folder say (this
    /// device: its database): no member needs what lies at or below it from the folder. A member without a head file
    /// here holds nothing as far as the folder knows — it may start reading it at any time, even after every writer
    /// is gone — so the floor is zero until every member has one; in spaces without a membership log (members
    /// unknown) it is always zero.
    func floor(_ snapshot: SharedSpace.Snapshot) -> [NodeID: UInt64] {
        guard let membership = snapshot.membership else { return [:] }
        var out = held
        for member in membership.current {
            let node = NodeID(bytes: member.keys.nodeID)
            guard node != me else { continue }
            guard let head = heads[node] else { return [:] }
            let theirs = Dictionary(head.held.map { (NodeID(bytes: $0.key), $0.value) }, uniquingKeysWith: max)
            for (origin, seq) in out { out[origin] = min(seq, theirs[origin] ?? 0) }
        }
        return out
    }

    /// Removes this device's files whose every entry lies at or below the floor (never the segment being appended
    /// to): the folder's size follows what its readers still need, not the history.
    func prune(below stable: [NodeID: UInt64]) {
        guard !stable.isEmpty else { return }
        for (key, cursor) in files where key.hasPrefix(me.hex + "/") {
            let name = String(key.dropFirst(me.hex.count + 1))
            guard name != segment?.name, cursor.usable, !cursor.waiting, cursor.memo.isEmpty,
                let stamp = cursor.stamp, cursor.offset == stamp.size, !cursor.ranges.isEmpty,
                cursor.ranges.allSatisfy({ origin, list in list.allSatisfy { $0.upperBound <= stable[origin] ?? 0 } })
            else { continue }
            if unlinkat(ownFD, name, 0) == 0 {
                files[key] = nil
                logger.debug("Folder segment every member holds removed", metadata: ["db": "\(db.name)", "file": "\(name)"])
            }
        }
    }

    /// Appends one record to this device's current segment, starting the next segment when it is full.
    func append(_ record: [UInt8]) throws {
        if segment == nil || !(segment?.isCurrent(in: ownFD) ?? false) {
            segment?.close()
            segment = try OwnSegment.open(dirFD: ownFD, dir: ownDir, space: space.id, writer: me.bytes, logger: logger)
        }
        guard var current = segment else { return }
        if current.size >= options.segmentBytes {
            try current.sync()
            current.close()
            current = try OwnSegment.create(
                dirFD: ownFD, dir: ownDir, number: current.number + 1, space: space.id, writer: me.bytes)
        }
        try current.append(record)
        segment = current
    }

    /// Replaces the head file (a temporary file, synced, renamed over it, the directory synced).
    func writeHead() throws {
        generation += 1
        let bytes = FolderFiles.Head.encode(
            space: space.id, identity: engine.identity, generation: generation, timeMs: UInt64(max(0, nowMs())),
            segment: segment?.number ?? 0, ownHead: try db.latestHead(origin: me),
            held: Dictionary(uniqueKeysWithValues: held.map { ($0.key.bytes, $0.value) }))
        try replaceFile(at: ownFD, "head", with: bytes)
        try db.setFolderGeneration(root, generation)
        headHeld = held
        headWrittenAt = uptimeMs()
    }

    /// Writes the members file when the log holds operations it does not.
    func writeMembers(_ snapshot: SharedSpace.Snapshot) throws {
        guard snapshot.membership != nil, snapshot.ops.count != membersWritten || !exists(at: ownFD, "members") else {
            return
        }
        let ops = snapshot.ops.values.sorted { $0.hash < $1.hash }.map(\.bytes)
        try replaceFile(at: ownFD, "members", with: FolderFiles.members(space: space.id, ops: ops))
        membersWritten = snapshot.ops.count
    }
}
