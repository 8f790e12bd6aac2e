import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import Foundation

/// A state snapshot ready to send: its sealed pieces, in order, and the manifest that signs them (SYNC.md §11).
public struct SealedSnapshot: Sendable {
    /// The pieces.
    public let parts: [SnapshotPart]
    /// The signed manifest.
    public let manifest: SnapshotManifest
    /// Bytes of the pieces.
    public var byteCount: Int { parts.reduce(0) { $0 + $1.bytes.count } }
}

/// Snapshots (SYNC.md §11): what a member sends a device that needs entries compacted away, and how that device
/// checks and installs one.
extension BlazeDatabase {
    /// Records per piece of a snapshot.
    public static let snapshotPartBytes = 1 << 20

    /// Seals pending local changes, then makes a snapshot of this replica's state, sealed with `key` and signed by
    /// `identity`. Nil when this device cannot seal (a reader, a removed member).
    public func makeSnapshot(key: SpaceKey, identity: DeviceIdentity, partBytes: Int = snapshotPartBytes) throws -> SealedSnapshot? {
        guard key.canSeal else { return nil }
        try sealLocal(key: key, identity: identity)
        var parts: [SnapshotPart] = []
        let heads = try exportSnapshot(partBytes: partBytes) { records in
            parts.append(SnapshotPart.seal(records, index: UInt32(parts.count), prev: parts.last?.hash ?? SealedEntry.genesis, key: key))
        }
        // The heads origins signed over exactly the entries the snapshot ends at, where this replica holds them: the
        // receiver can then remove such an origin with a cutoff it proves (SYNC.md §11, "Snapshots").
        let signed = try heads.compactMap { origin, head -> SignedHead? in
            guard let held = try latestHead(origin: origin), held.seq == head.seq, held.hash == head.hash else { return nil }
            return held
        }
        let manifest = SnapshotManifest(
            space: key.id, createdMs: UInt64(max(0, Date().timeIntervalSince1970 * 1000)), parts: UInt32(parts.count),
            size: UInt64(parts.reduce(0) { $0 + $1.bytes.count }), lastPart: parts.last!.hash,
            heads: Dictionary(uniqueKeysWithValues: heads.map { ($0.key.bytes, (seq: $0.value.seq, hash: $0.value.hash)) }),
            signedHeads: signed, identity: identity)
        return SealedSnapshot(parts: parts, manifest: manifest)
    }

    /// Opens the pieces of a snapshot in order, checking their chain: `expected` is the next index and `prev` the
    /// hash the next piece must name.
    public static func openSnapshotPart(_ part: SnapshotPart, expected: UInt32, prev: [UInt8], key: SpaceKey) throws(SyncRejection)
        -> [UInt8]
    {
        guard part.index == expected, part.prev == prev else { throw .badSnapshot }
        return try part.open(with: key)
    }

    /// Checks a snapshot's manifest before any of its pieces is taken (SYNC.md §11): of `space`, at most
    /// `maxBytes` declared, as many pieces as that size can hold, and its author a current writing member of
    /// `membership` with the key it signed with (when the space has a log). When `peer` (the key the connection
    /// proved) is a member the log lists, the author must be that peer: a member sends only its own snapshots; an
    /// unlisted peer (a relay) passes on a writer's. `badSnapshot` otherwise, as for a signed head of an origin the
    /// log does not list, or under another key than the one it lists (signatures are checked at the install).
    public static func checkSnapshotManifest(
        _ manifest: SnapshotManifest, space: SpaceID, membership: MembershipState?, peer: DevicePublicKeys?, maxBytes: Int
    ) throws(SyncRejection) {
        guard manifest.space == space, manifest.size <= UInt64(maxBytes),
            UInt64(manifest.parts) * UInt64(SnapshotPart.minBytes) <= manifest.size,
            manifest.size <= UInt64(manifest.parts) * UInt64(SnapshotPart.maxBytes)
        else { throw .badSnapshot }
        guard let membership else { return }
        guard let author = membership.member(manifest.author), author.isCurrent, author.role.writes,
            author.keys.signing == manifest.authorKey
        else { throw .badSnapshot }
        // Signed heads only of origins the log lists, under their listed keys (so at most one per member); their
        // signatures are checked at the install, off the event loop.
        guard manifest.signedHeads.allSatisfy({ membership.member($0.origin)?.keys.signing == $0.publicKey }) else {
            throw .badSnapshot
        }
        if let peer, let listed = membership.member(peer.nodeID), listed.keys.signing == peer.signing {
            guard manifest.authorKey == peer.signing else { throw .badSnapshot }
        }
    }

    /// Checks a snapshot's manifest against the pieces received (`count` of them, the last with hash `lastHash`),
    /// its space, and its author (a current writing member of `membership`, when the space has a log), then installs
    /// it with `records` (the opened pieces). Refuses (`badSnapshot`) a snapshot that covers nothing this replica
    /// lacks. Returns what replaying this replica's own later changes did.
    public func install(
        snapshot manifest: SnapshotManifest, records: [[UInt8]], lastHash: [UInt8], key: SpaceKey, membership: MembershipState?
    ) throws -> ReceiveReport {
        guard manifest.parts == records.count, manifest.lastPart == lastHash else { throw SyncRejection.badSnapshot }
        var next = 0
        return try install(snapshot: manifest, key: key, membership: membership) {
            defer { next += 1 }
            return next < records.count ? records[next] : nil
        }
    }

    /// Installs a snapshot whose pieces were checked against `manifest` as they came (`SnapshotStaging`), reading
    /// their opened records one at a time from `records` (nil after the last): the snapshot is never held whole.
    /// Checks the manifest's space and author again (the log may have changed while the pieces came); refuses
    /// (`badSnapshot`) a snapshot that covers nothing this replica lacks. Returns what replaying this replica's own
    /// later changes did.
    public func install(
        snapshot manifest: SnapshotManifest, key: SpaceKey, membership: MembershipState?, records: () throws -> [UInt8]?
    ) throws -> ReceiveReport {
        guard manifest.space == key.id, (try? manifest.verifySignedHeads(keyOf: { membership?.member($0)?.keys.signing })) != nil,
            membership.map({ m in manifest.signedHeads.allSatisfy { m.member($0.origin) != nil } }) ?? true
        else { throw SyncRejection.badSnapshot }
        if let membership {
            guard let author = membership.member(manifest.author), author.isCurrent, author.role.writes,
                author.keys.signing == manifest.authorKey
            else { throw SyncRejection.badSnapshot }
        }
        var heads: [NodeID: PrunedHead] = [:]
        for (origin, head) in manifest.heads { heads[NodeID(bytes: origin)] = PrunedHead(seq: head.seq, hash: head.hash) }
        let applied = try versionVector()
        guard heads.contains(where: { $0.value.seq > applied[$0.key] }) else { throw SyncRejection.badSnapshot }
        let maxDepth = limits.maxDepth
        do {
            return try installSnapshot(
                heads: heads,
                signedHeads: manifest.signedHeads.map { (NodeID(bytes: $0.origin), $0.seq, $0.bytes) },
                parts: records,
                openEntry: { bytes in
                    let entry = try SealedEntry(bytes: bytes)
                    let payload = try entry.open(with: key)
                    guard let json = try? JSONParser(maxDepth: maxDepth + 4).parse(String(decoding: payload, as: UTF8.self)),
                        let change = try? Change(json: json)
                    else { throw SyncRejection.badPayload }
                    return change
                })
        } catch let error as StoreError where error.kind == "bad_snapshot" {
            throw SyncRejection.badSnapshot
        }
    }
}
