import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import NIOCore

/// Snapshots through the relay (SYNC.md §11, Protocol/RELAY.md "What it does"): a member's upload (its signed manifest
/// first, checked before any piece is taken, then its pieces, each checked as it comes and staged in the store, kept in
/// one transaction after the last), and the snapshot sent to a device that lacks what it covers (manifest first, too).
/// Only the piece at hand is in memory.
extension RelayConnection {
    /// The manifest that opens an upload: accepted only from a current writing member the log lists with the key this
    /// connection proved, as the snapshot's author, with no other upload under way; refused (`bad_snapshot`, and the
    /// connection closed) otherwise. One over the relay's `SnapshotUploadLimits`, or for which the staging room is in
    /// use, is declined: its pieces are checked and ignored, and the connection serves on.
    func beginUpload(_ manifest: SnapshotManifest, space: SpaceID, context: ChannelHandlerContext) {
        guard upload == nil else {
            refuse(.badSnapshot, context: context)
            return
        }
        let device = self.device
        let stale = RelayServer.nowMs() - relay.snapshotUploads.staleAfterMs
        run(context: context, { relay in
            try RelayRules.checkManifest(manifest, space: space, membership: try await relay.membership(space), device: device)
            // What uploads of a process that stopped mid-way staged goes as new ones begin.
            _ = try await relay.store.dropSnapshotUploads(startedBefore: stale)
        }) { connection, _, context in
            connection.storing = false
            let relay = connection.relay
            var upload = SnapshotUpload(manifest: manifest, startedMs: RelayServer.nowMs())
            // Compared before it is converted: a manifest's size is the device's word.
            let fits = manifest.size <= UInt64(relay.snapshotUploads.maxBytes)
            if fits, relay.snapshotStaging.reserve(Int(manifest.size), for: space.hex) { upload.reserved = Int(manifest.size) }
            connection.upload = upload
            if !fits {
                connection.decline("it is larger than the relay takes", space: space)
            } else if upload.reserved == 0 {
                connection.decline("the relay's room for snapshot uploads (of this space, or in all) is in use", space: space)
            } else {
                connection.armUploadDeadline(space: space, context: context)
            }
            connection.resumeReading(context: context)
            connection.storeNext(space: space, context: context)
        }
    }

    /// One piece of the upload under way, checked against its manifest and the pieces before it (`SnapshotUpload`)
    /// before anything is written; a piece with no accepted manifest, or out of place, is refused (`bad_snapshot`) and
    /// the connection closed. Staged in the store as it comes (ignored once the upload is declined); the last one keeps
    /// the snapshot.
    func stage(_ part: SnapshotPart, space: SpaceID, context: ChannelHandlerContext) {
        guard var upload else {
            refuse(.badSnapshot, context: context)
            return
        }
        let last: Bool
        do { last = try upload.take(part) } catch {
            refuse(error, context: context)
            return
        }
        guard upload.declined == nil else {
            self.upload = last ? nil : upload
            storing = false
            resumeReading(context: context)
            storeNext(space: space, context: context)
            return
        }
        self.upload = upload
        let (id, startedMs, ended, manifest) = (upload.id, upload.startedMs, upload.ended, upload.manifest)
        run(context: context, { relay -> Bool? in
            try await relay.store.stageSnapshotPart(part, upload: id, space: space, startedMs: startedMs)
            // Declined or closed while it was written: what it staged goes (again, for this piece).
            guard !ended.isSet else {
                try await relay.store.dropSnapshotUpload(id)
                return nil
            }
            guard last else { return nil }
            do {
                return try await relay.store.keepSnapshot(manifest, upload: id, space: space)
            } catch {
                try? await relay.store.dropSnapshotUpload(id)
                throw error
            }
        }) { connection, kept, context in
            connection.storing = false
            if last { connection.finishUpload(manifest, kept: kept ?? false, space: space) }
            connection.resumeReading(context: context)
            connection.storeNext(space: space, context: context)
        }
    }

    /// Declines the upload under way: what it staged goes and its room is given back; the rest of its pieces, no more
    /// than its manifest declares, are checked and ignored. Counted (`blaze_relay_snapshots_dropped_total`).
    func decline(_ why: String, space: SpaceID) {
        guard var upload, upload.declined == nil, !upload.complete else { return }
        uploadDeadline?.cancel()
        relay.snapshotStaging.release(upload.reserved, for: space.hex)
        let staged = upload.reserved > 0
        (upload.reserved, upload.declined) = (0, why)
        upload.ended.set()
        self.upload = upload
        if staged {
            let (store, id) = (relay.store, upload.id)
            Task(executorPreference: relay.executor) { try? await store.dropSnapshotUpload(id) }
        }
        relay.record(.snapshotDropped)
        relay.logger.warning("Relay declined a snapshot upload", metadata: ["why": "\(why)", "space": "\(space.hex)"])
    }

    /// An upload whose last piece has not come within the relay's window after its manifest is declined: a connection
    /// kept alive with pings cannot hold the staging room for good.
    private func armUploadDeadline(space: SpaceID, context: ChannelHandlerContext) {
        uploadDeadline?.cancel()
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        uploadDeadline = context.eventLoop.scheduleTask(in: relay.snapshotUploads.window) {
            bound.value.decline("its last piece did not come in time", space: space)
        }
    }

    /// The last piece was staged and the snapshot kept or not: the upload's room is given back; the device holds what
    /// it covers, and devices that lack it get it from now on.
    private func finishUpload(_ manifest: SnapshotManifest, kept: Bool, space: SpaceID) {
        uploadDeadline?.cancel()
        if let upload { relay.snapshotStaging.release(upload.reserved, for: space.hex) }
        upload = nil
        if var v = peerVector {
            for (origin, head) in manifest.heads { v[NodeID(bytes: origin)] = max(v[NodeID(bytes: origin)] ?? 0, head.seq) }
            peerVector = v
        }
        guard kept else { return }
        relay.record(.snapshotKept)
        relay.logger.info(
            "Relay kept a snapshot",
            metadata: ["space": "\(space.hex)", "pieces": "\(manifest.parts)", "author": "\(hexString(manifest.author))"])
        relay.announce(space: space, except: listener, .entries)
    }

    /// Gives back what the upload under way holds (its connection closed): its room, and what it staged, unless its
    /// last piece is in (the keep under way drops the staged pieces either way).
    func releaseUpload(space: SpaceID) {
        uploadDeadline?.cancel()
        guard let upload else { return }
        self.upload = nil
        relay.snapshotStaging.release(upload.reserved, for: space.hex)
        guard upload.declined == nil, !upload.complete else { return }
        upload.ended.set()
        let (store, id) = (relay.store, upload.id)
        Task(executorPreference: relay.executor) { try? await store.dropSnapshotUpload(id) }
    }

    /// Sends the device the space's snapshot, its manifest then piece by piece (each read once the one before is
    /// written), and pumps again: the device lacks entries the relay holds only as that snapshot. Only one whose
    /// author the log still lists as a current writing member (else the device would refuse it, again and again).
    func sendSnapshot(space: SpaceID, context: ChannelHandlerContext) {
        run(context: context, { relay -> SnapshotManifest? in
            guard let manifest = try await relay.store.snapshotManifest(space: space),
                let author = try await relay.membership(space)?.member(manifest.author), author.isCurrent, author.role.writes
            else { return nil }
            return manifest
        }) { connection, manifest, context in
            guard let manifest else {
                connection.relay.logger.info(
                    "Relay holds no snapshot a device lacking compacted entries could take", metadata: ["space": "\(space.hex)"])
                // What else it lacks still goes (the snapshot is not tried again on this connection).
                connection.pumping = false
                connection.pump(space: space, context: context)
                return
            }
            // The signed manifest first: the device checks it before it takes any piece.
            connection.send(.snapshot(manifest), context: context)
            connection.sendSnapshotPart(0, prev: SealedEntry.genesis, manifest: manifest, space: space, context: context)
        }
    }

    func sendSnapshotPart(
        _ index: UInt32, prev: [UInt8], manifest: SnapshotManifest, space: SpaceID, context: ChannelHandlerContext
    ) {
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        guard index < manifest.parts else {
            if var v = peerVector {
                for (origin, head) in manifest.heads { v[NodeID(bytes: origin)] = max(v[NodeID(bytes: origin)] ?? 0, head.seq) }
                peerVector = v
            }
            relay.record(.snapshotSent)
            pumping = false
            pump(space: space, context: context)
            return
        }
        run(context: context, { try await $0.store.snapshotPart(space: space, index: index) }) { connection, part, context in
            // Replaced meanwhile: the device starts again on its next connection.
            guard let part, part.prev == prev else {
                connection.close(context: context)
                return
            }
            connection.send(.snapshotPart(part), context: context)?.whenComplete { _ in
                let (connection, context) = bound.value
                guard case .established = connection.state else { return }
                connection.sendSnapshotPart(index + 1, prev: part.hash, manifest: manifest, space: space, context: context)
            }
        }
    }
}
