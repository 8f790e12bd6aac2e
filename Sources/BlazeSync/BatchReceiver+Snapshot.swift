import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import NIOCore

/// Snapshots a peer sends (SYNC.md §11): the signed manifest first, checked before any piece is taken, then the pieces,
/// each checked as it comes and staged on disk (`SnapshotStaging`), then the install, which reads them back one at a
/// time. A piece with no accepted manifest before it, or out of place, is refused (`bad_snapshot`) and ends the session.
extension BatchReceiver {
    /// Accepts a snapshot's manifest: of this space, within `maxSnapshotBytes`, from a current writer (the peer
    /// itself, when the log lists the peer), covering something this replica lacks, with no other snapshot under way;
    /// then opens its staging file.
    func accept(_ manifest: SnapshotManifest, link: SyncLinkEstablished, context: ChannelHandlerContext) {
        let space = link.space.snapshot
        do {
            guard staging == nil else { throw SyncRejection.badSnapshot }
            // A peer the log does not list passes on a snapshot only when it is a relay this device dialed: any other
            // (a capability holder, a removed member under a fresh key) could replay a stale one.
            if !relay, let membership = space.membership, membership.member(link.device.nodeID)?.keys != link.device {
                throw SyncRejection.badSnapshot
            }
            try BlazeDatabase.checkSnapshotManifest(
                manifest, space: space.key.id, membership: space.membership, peer: link.device, maxBytes: Self.maxSnapshotBytes)
        } catch {
            refuseSnapshot(error, context: context)
            return
        }
        applying = true
        let (db, budget) = (link.db, engine.stagingBudget)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        engine.pool.runIfActive(eventLoop: context.eventLoop) { () -> SnapshotStaging in
            // One that covers nothing this replica lacks would be refused at the install: nothing of it is taken.
            let applied = try db.versionVector()
            guard manifest.heads.contains(where: { $0.value.seq > applied[NodeID(bytes: $0.key)] }) else {
                throw SyncRejection.badSnapshot
            }
            return try SnapshotStaging(manifest: manifest, db: db, budget: budget)
        }
        .whenComplete { result in
                let (receiver, context) = bound.value
                receiver.applying = false
                switch result {
                case .success(let staging) where !receiver.stopped:
                    receiver.staging = staging
                    receiver.resumeReading(context: context)
                    receiver.applyNext(context: context)
                case .success(let staging):
                    staging.remove()
                case .failure(let error as SyncRejection):
                    receiver.refuseSnapshot(error, context: context)
                case .failure(let error):
                    // No room to stage it now (or no disk): a local failure; a later session takes it.
                    receiver.refuseSnapshot(LocalFailure(error), context: context)
                }
            }
    }

    /// Checks the next piece against the manifest and the pieces before it, opens it and stages its records; installs
    /// the snapshot after the last. Only the piece itself is in memory, within the engine's `snapshotBudget`.
    func applySnapshotPart(_ part: SnapshotPart, link: SyncLinkEstablished, context: ChannelHandlerContext) {
        guard let staging else {
            refuseSnapshot(SyncRejection.badSnapshot, context: context)
            return
        }
        let budget = engine.snapshotBudget
        // The opened records are at most the piece's size.
        let reserved = part.bytes.count * 2
        guard budget.reserve(reserved) else {
            // Other sessions are opening as much as the engine allows: this one ends, and gets one on a later session.
            refuseSnapshot(LocalFailure(SnapshotMemoryInUse()), context: context)
            return
        }
        applying = true
        let key = link.key
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        engine.pool.runIfActive(eventLoop: context.eventLoop) { () -> Bool in
            defer { budget.release(reserved) }
            try staging.append(part, key: key)
            return staging.complete
        }.whenComplete { result in
            let (receiver, context) = bound.value
            receiver.applying = false
            guard !receiver.stopped else { return }
            switch result {
            case .success(true):
                receiver.install(staging, link: link, context: context)
            case .success(false):
                receiver.resumeReading(context: context)
                receiver.applyNext(context: context)
            case .failure(let error):
                receiver.refuseSnapshot(error, context: context)
            }
        }
    }

    /// Installs a snapshot whose pieces all came and checked, reading them back from its staging file, then deletes
    /// the file.
    private func install(_ staging: SnapshotStaging, link: SyncLinkEstablished, context: ChannelHandlerContext) {
        applying = true
        self.staging = nil
        let manifest = staging.manifest
        let (db, space) = (link.db, link.space.snapshot)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        engine.pool.runIfActive(eventLoop: context.eventLoop) {
            defer { staging.remove() }
            return try db.install(snapshot: manifest, key: space.key, membership: space.membership, records: try staging.reader())
        }.whenComplete { result in
            let (receiver, context) = bound.value
            receiver.applying = false
            guard !receiver.stopped else { return }
            switch result {
            case .success:
                // What this device held below the installed snapshot is gone: a snapshot built before cannot be
                // followed by it.
                receiver.engine.snapshots.forget(db: db.name)
                receiver.report.update {
                    $0.snapshotsInstalled += 1
                    $0.lastSyncMs = nowMs()
                }
                receiver.engine.logger.info(
                    "Sync installed a snapshot",
                    metadata: ["db": "\(db.name)", "peer": "\(receiver.report.peer)", "author": "\(hexString(manifest.author))"])
                receiver.resumeReading(context: context)
                receiver.applyNext(context: context)
            case .failure(let error):
                receiver.stop()
                context.fireErrorCaught(error)
            }
        }
    }

    /// Ends the session for a snapshot refused (or one this device cannot take now): the staging file is deleted.
    private func refuseSnapshot(_ error: any Error, context: ChannelHandlerContext) {
        stop()
        context.fireErrorCaught(error)
    }

    /// Deletes the staging file of the snapshot under way, if any.
    func dropStaging() {
        guard let staging else { return }
        self.staging = nil
        // Here, not on the I/O pool, which may have stopped: a piece being written meanwhile finds the file closed.
        staging.remove()
    }
}

/// Sessions together open as many snapshot pieces as the engine allows: one more must wait for a later session.
struct SnapshotMemoryInUse: Error, CustomStringConvertible {
    var description: String { "other sessions hold the memory snapshot pieces may take; a later session takes this one" }
}
