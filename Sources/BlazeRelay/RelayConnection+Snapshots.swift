import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import NIOCore

/// Snapshots through the relay (SYNC.md §11, Protocol/RELAY.md "What it does"): a member's upload (its signed manifest
/// first, checked before any piece is taken, then its pieces, each checked as it comes and held in memory only within
/// bounds until the last), and the snapshot sent to a device that lacks what it covers (manifest first, too).
extension RelayConnection {
    /// The manifest that opens an upload: accepted only from a current writing member the log lists with the key this
    /// connection proved, as the snapshot's author, declaring at most `RelayRules.maxSnapshotBytes`, with no other
    /// upload under way. Refused (`bad_snapshot`, and the connection closed) otherwise.
    func beginUpload(_ manifest: SnapshotManifest, space: [UInt8], context: ChannelHandlerContext) {
        guard uploadManifest == nil else {
            refuse(.badSnapshot, context: context)
            return
        }
        let device = self.device
        run(context: context, { relay in
            try RelayRules.checkManifest(manifest, space: space, membership: try await relay.membership(space), device: device)
        }) { connection, _, context in
            connection.storing = false
            connection.uploadManifest = manifest
            (connection.uploadNext, connection.uploadLast, connection.uploadSeen) = (0, SealedEntry.genesis, 0)
            connection.uploadDropped = false
            connection.armUploadDeadline(space: space, context: context)
            connection.resumeReading(context: context)
            connection.storeNext(space: space, context: context)
        }
    }

    /// One piece of the upload under way, checked against its manifest and the pieces before it: the next index,
    /// naming the previous piece's hash, no more than the manifest counts, within its declared size, the last the one
    /// it names. A piece with no accepted manifest, or out of place, is refused (`bad_snapshot`) and the connection
    /// closed. Kept in memory within `RelayRules.maxSnapshotBytes` and the relay's `snapshotBudget` across
    /// connections; past them the upload is dropped whole (its other pieces are checked and ignored); the snapshot is
    /// checked and kept after its last piece.
    func stage(_ part: SnapshotPart, space: [UInt8], context: ChannelHandlerContext) {
        let bytes = part.bytes.count
        guard let manifest = uploadManifest, uploadNext < manifest.parts, part.index == uploadNext, part.prev == uploadLast,
            uploadSeen + UInt64(bytes) <= manifest.size
        else {
            refuse(.badSnapshot, context: context)
            return
        }
        let isLast = uploadNext + 1 == manifest.parts
        guard !isLast || (part.hash == manifest.lastPart && uploadSeen + UInt64(bytes) == manifest.size) else {
            refuse(.badSnapshot, context: context)
            return
        }
        (uploadNext, uploadLast, uploadSeen) = (uploadNext + 1, part.hash, uploadSeen + UInt64(bytes))
        if !uploadDropped {
            if uploadBytes + bytes > RelayRules.maxSnapshotBytes {
                dropUpload("it is larger than the relay keeps", space: space)
            } else if !relay.snapshotBudget.reserve(bytes, for: hexString(space)) {
                dropUpload("the relay's memory for snapshot uploads (of this space, or in all) is in use", space: space)
            } else {
                uploadBytes += bytes
                uploadParts.append(part)
            }
        }
        guard isLast else {
            storing = false
            resumeReading(context: context)
            storeNext(space: space, context: context)
            return
        }
        finishUpload(manifest, space: space, context: context)
    }

    /// Drops the upload under way, giving its memory back; the rest of its pieces are checked and ignored.
    func dropUpload(_ why: String, space: [UInt8]) {
        releaseUpload(space: space)
        uploadDropped = true
        relay.record(.snapshotDropped)
        relay.logger.warning("Relay dropped a snapshot upload", metadata: ["why": "\(why)"])
    }

    /// An upload whose last piece has not come `RelayRules.snapshotUploadTimeout` after its manifest is dropped, and
    /// its manifest forgotten (a piece after that is refused): a connection kept alive with pings cannot hold the
    /// memory for good.
    private func armUploadDeadline(space: [UInt8], context: ChannelHandlerContext) {
        uploadDeadline?.cancel()
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        uploadDeadline = context.eventLoop.scheduleTask(in: RelayRules.snapshotUploadTimeout) {
            let (connection, _) = bound.value
            guard connection.uploadManifest != nil else { return }
            connection.dropUpload("its last piece did not come in time", space: space)
            connection.uploadManifest = nil
        }
    }

    /// The last piece came: the snapshot is checked and kept, unless the upload was dropped. Its memory stays
    /// reserved until the check and the store end, even if the connection closes first.
    private func finishUpload(_ manifest: SnapshotManifest, space: [UInt8], context: ChannelHandlerContext) {
        let (parts, dropped, reserved) = (uploadParts, uploadDropped, uploadBytes)
        (uploadParts, uploadDropped, uploadBytes, uploadManifest) = ([], false, 0, nil)
        uploadDeadline?.cancel()
        guard !dropped else {
            storing = false
            resumeReading(context: context)
            storeNext(space: space, context: context)
            return
        }
        keep(snapshot: manifest, parts: parts, reserved: reserved, space: space, context: context)
    }

    /// Gives back the memory the upload under way reserved (dropped, or its connection closed).
    func releaseUpload(space: [UInt8]) {
        uploadDeadline?.cancel()
        relay.snapshotBudget.release(uploadBytes, for: hexString(space))
        (uploadParts, uploadBytes) = ([], 0)
    }

    /// Checks and keeps a snapshot the device uploaded; a snapshot that does not check is refused (`bad_snapshot`).
    /// The device holds what it covers; devices that lack it get it from now on.
    func keep(
        snapshot manifest: SnapshotManifest, parts: [SnapshotPart], reserved: Int, space: [UInt8], context: ChannelHandlerContext
    ) {
        run(context: context, { relay -> Bool in
            defer { relay.snapshotBudget.release(reserved, for: hexString(space)) }
            try RelayRules.checkSnapshot(manifest, parts: parts, space: space, membership: try await relay.membership(space))
            let (upload, startedMs) = (SpaceKey.randomBytes(16), RelayServer.nowMs())
            do {
                for part in parts { try await relay.store.stageSnapshotPart(part, upload: upload, space: space, startedMs: startedMs) }
                return try await relay.store.keepSnapshot(manifest, upload: upload, space: space)
            } catch {
                try? await relay.store.dropSnapshotUpload(upload)
                throw error
            }
        }) { connection, kept, context in
            connection.storing = false
            if var v = connection.peerVector {
                for (origin, head) in manifest.heads { v[NodeID(bytes: origin)] = max(v[NodeID(bytes: origin)] ?? 0, head.seq) }
                connection.peerVector = v
            }
            if kept {
                connection.relay.record(.snapshotKept)
                connection.relay.logger.info(
                    "Relay kept a snapshot",
                    metadata: ["space": "\(hexString(space))", "pieces": "\(parts.count)", "author": "\(hexString(manifest.author))"])
                connection.relay.announce(space: space, except: connection.listener, .entries)
            }
            connection.resumeReading(context: context)
            connection.storeNext(space: space, context: context)
        }
    }

    /// Sends the device the space's snapshot, its manifest then piece by piece (each read once the one before is
    /// written), and pumps again: the device lacks entries the relay holds only as that snapshot. Only one whose
    /// author the log still lists as a current writing member (else the device would refuse it, again and again).
    func sendSnapshot(space: [UInt8], context: ChannelHandlerContext) {
        run(context: context, { relay -> SnapshotManifest? in
            guard let manifest = try await relay.store.snapshotManifest(space: space),
                let author = try await relay.membership(space)?.member(manifest.author), author.isCurrent, author.role.writes
            else { return nil }
            return manifest
        }) { connection, manifest, context in
            guard let manifest else {
                connection.relay.logger.info(
                    "Relay holds no snapshot a device lacking compacted entries could take", metadata: ["space": "\(hexString(space))"])
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
        _ index: UInt32, prev: [UInt8], manifest: SnapshotManifest, space: [UInt8], context: ChannelHandlerContext
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
