import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import NIOCore

/// Snapshots through the relay (SYNC.md §11, Protocol/RELAY.md "What it does"): a member's upload, held in memory
/// only within bounds until its manifest comes, and the snapshot sent to a device that lacks what it covers.
extension RelayConnection {
    /// One piece of a snapshot the device uploads, in order with what it sent before. Kept until its manifest comes
    /// only when the device is a current writing member the log lists with the key it proved (only such a member's
    /// snapshot is kept), within `RelayRules.maxSnapshotBytes` per upload and the relay's `snapshotBudget` across
    /// connections; otherwise the upload is dropped whole (not refused: a member leaves another one next time).
    func stage(_ part: SnapshotPart, space: [UInt8], context: ChannelHandlerContext) {
        let device = self.device
        run(context: context, { relay -> Bool in
            guard let device, let member = try await relay.membership(space)?.member(device.nodeID) else { return false }
            return member.isCurrent && member.role.writes && member.keys == device
        }) { connection, writer, context in
            connection.storing = false
            connection.add(part, fromWriter: writer, space: space, context: context)
            connection.resumeReading(context: context)
            connection.storeNext(space: space, context: context)
        }
    }

    private func add(_ part: SnapshotPart, fromWriter writer: Bool, space: [UInt8], context: ChannelHandlerContext) {
        guard !uploadDropped else { return }
        let bytes = part.bytes.count
        let why: String? =
            !writer
            ? "its sender is not a current writing member"
            : uploadBytes + bytes > RelayRules.maxSnapshotBytes
                ? "it is larger than the relay keeps"
                : !relay.snapshotBudget.reserve(bytes, for: hexString(space))
                    ? "the relay's memory for snapshot uploads (of this space, or in all) is in use" : nil
        guard let why else {
            if uploadParts.isEmpty { armUploadDeadline(space: space, context: context) }
            uploadBytes += bytes
            uploadParts.append(part)
            return
        }
        dropUpload(why, space: space)
    }

    /// Drops the upload under way, giving its memory back; the rest of it is ignored until its manifest.
    func dropUpload(_ why: String, space: [UInt8]) {
        releaseUpload(space: space)
        uploadDropped = true
        relay.record(.snapshotDropped)
        relay.logger.warning("Relay dropped a snapshot upload", metadata: ["why": "\(why)"])
    }

    /// An upload whose manifest has not come `RelayRules.snapshotUploadTimeout` after its first piece is dropped: a
    /// connection kept alive with pings cannot hold the memory for good.
    private func armUploadDeadline(space: [UInt8], context: ChannelHandlerContext) {
        uploadDeadline?.cancel()
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        uploadDeadline = context.eventLoop.scheduleTask(in: RelayRules.snapshotUploadTimeout) {
            let (connection, _) = bound.value
            guard !connection.uploadParts.isEmpty else { return }
            connection.dropUpload("its manifest did not come in time", space: space)
        }
    }

    /// The manifest that ends an upload: the snapshot is checked and kept, unless the upload was dropped. Its memory
    /// stays reserved until the check and the store end, even if the connection closes first.
    func finishUpload(_ manifest: SnapshotManifest, space: [UInt8], context: ChannelHandlerContext) {
        let (parts, dropped, reserved) = (uploadParts, uploadDropped, uploadBytes)
        (uploadParts, uploadDropped, uploadBytes) = ([], false, 0)
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
            return try await relay.store.keepSnapshot(manifest, parts: parts, space: space)
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

    /// Sends the device the space's snapshot, piece by piece (each read once the one before is written), then its
    /// manifest, and pumps again: the device lacks entries the relay holds only as that snapshot. Only one whose
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
            connection.sendSnapshotPart(0, prev: SealedEntry.genesis, manifest: manifest, space: space, context: context)
        }
    }

    func sendSnapshotPart(
        _ index: UInt32, prev: [UInt8], manifest: SnapshotManifest, space: [UInt8], context: ChannelHandlerContext
    ) {
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        guard index < manifest.parts else {
            let written = send(.snapshot(manifest), context: context)
            if var v = peerVector {
                for (origin, head) in manifest.heads { v[NodeID(bytes: origin)] = max(v[NodeID(bytes: origin)] ?? 0, head.seq) }
                peerVector = v
            }
            relay.record(.snapshotSent)
            written?.whenComplete { _ in
                let (connection, context) = bound.value
                connection.pumping = false
                guard case .established = connection.state else { return }
                connection.pump(space: space, context: context)
            }
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
