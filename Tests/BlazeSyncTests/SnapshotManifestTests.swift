import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeSync
import Testing

/// A snapshot's manifest comes first and is checked before any piece is taken (SYNC.md §11): its space, its declared
/// size and piece count, and its author — a current writing member, and the peer itself when the log lists the peer.
@Suite struct SnapshotManifestTests {
    let admin = DeviceIdentity()
    let writer = DeviceIdentity()
    let reader = DeviceIdentity()
    let space: SpaceID
    let log: MembershipState

    init() throws {
        let salt = SpaceKey.randomBytes(16)
        space = MembershipOp.spaceID(creator: admin.publicKeys, salt: salt)
        let create = try MembershipOp(space: space, author: admin, timeMs: 1, parents: [], action: .create(salt: salt), envelopes: [])
        let addWriter = try MembershipOp(
            space: space, author: admin, timeMs: 2, parents: [create.hash], action: .add(device: writer.publicKeys, role: .writer),
            envelopes: [])
        let addReader = try MembershipOp(
            space: space, author: admin, timeMs: 3, parents: [addWriter.hash], action: .add(device: reader.publicKeys, role: .reader),
            envelopes: [])
        log = MembershipState(space: space, ops: [create, addWriter, addReader])
    }

    func manifest(by author: DeviceIdentity, space: SpaceID? = nil, parts: UInt32 = 2, size: UInt64 = 4_000) -> SnapshotManifest {
        SnapshotManifest(
            space: space ?? self.space, createdMs: 1, parts: parts, size: size, lastPart: SpaceKey.randomBytes(32), heads: [:],
            identity: author)
    }

    func check(_ m: SnapshotManifest, peer: DevicePublicKeys?, maxBytes: Int = 1 << 20) throws {
        try BlazeDatabase.checkSnapshotManifest(m, space: space, membership: log, peer: peer, maxBytes: maxBytes)
    }

    @Test func aManifestFromANonWriterIsRefusedBeforeAnyPiece() throws {
        #expect(log.member(writer.nodeID)?.role.writes == true && log.member(reader.nodeID)?.role.writes == false)
        // A writer's own, over its connection, or passed on by an unlisted peer (a relay).
        try check(manifest(by: writer), peer: writer.publicKeys)
        try check(manifest(by: writer), peer: DeviceIdentity().publicKeys)
        // A reader's, or a stranger's, whoever passes it on.
        #expect(throws: SyncRejection.badSnapshot) { try check(manifest(by: reader), peer: reader.publicKeys) }
        #expect(throws: SyncRejection.badSnapshot) { try check(manifest(by: reader), peer: DeviceIdentity().publicKeys) }
        let stranger = DeviceIdentity()
        #expect(throws: SyncRejection.badSnapshot) { try check(manifest(by: stranger), peer: stranger.publicKeys) }
        // A listed member passes on no one else's snapshot, not even a writer's.
        #expect(throws: SyncRejection.badSnapshot) { try check(manifest(by: writer), peer: reader.publicKeys) }
        #expect(throws: SyncRejection.badSnapshot) { try check(manifest(by: writer), peer: admin.publicKeys) }
    }

    @Test func aManifestDeclaringTooMuchOrAnotherSpaceIsRefused() throws {
        // Over the receiver's limit, more pieces than the declared size can hold, another space.
        #expect(throws: SyncRejection.badSnapshot) { try check(manifest(by: writer, size: (1 << 20) + 1), peer: nil) }
        #expect(throws: SyncRejection.badSnapshot) { try check(manifest(by: writer, parts: 100, size: 1_000), peer: nil) }
        // Fewer pieces than the declared size needs: it would hold a staging reservation no piece could fill.
        #expect(throws: SyncRejection.badSnapshot) {
            try check(manifest(by: writer, parts: 1, size: UInt64(SnapshotPart.maxBytes) + 1), peer: nil, maxBytes: 1 << 30)
        }
        try check(manifest(by: writer, parts: 2, size: UInt64(SnapshotPart.maxBytes) + 1), peer: nil, maxBytes: 1 << 30)
        #expect(throws: SyncRejection.badSnapshot) {
            try check(manifest(by: writer, space: SpaceID(bytes: SpaceKey.randomBytes(16))!), peer: nil)
        }
        try check(manifest(by: writer, size: 1 << 20), peer: nil)
        // The declared size travels signed.
        #expect(try SnapshotManifest(bytes: manifest(by: writer, size: 12_345).bytes).size == 12_345)
    }

    /// The heads an origin signed over the entries a snapshot ends at travel signed in the manifest; one that names
    /// another entry than the snapshot covers is malformed, and one signed with another key than the log lists for
    /// its origin (or not signed by it at all) refuses the snapshot before any piece.
    @Test func signedHeadsInAManifestMustBeTheOriginsOwn() throws {
        let key = try SpaceKey(id: space, epoch: 1, secrets: [1: SpaceKey.randomSecret()])
        let entry = SealedEntry.seal(Array("x".utf8), space: key, origin: writer.nodeID, seq: 3, prev: SealedEntry.genesis)
        let head = SignedHead(signing: entry, identity: writer)
        func signed(_ heads: [SignedHead], covering seq: UInt64 = 3) -> SnapshotManifest {
            SnapshotManifest(
                space: space, createdMs: 1, parts: 2, size: 4_000, lastPart: SpaceKey.randomBytes(32),
                heads: [writer.nodeID: (seq, entry.hash)], signedHeads: heads, identity: writer)
        }
        let good = try SnapshotManifest(bytes: signed([head]).bytes)
        #expect(good.signedHeads == [head])
        try check(good, peer: writer.publicKeys)
        // Naming another entry than the one covered: left out when signing, malformed when decoding.
        #expect(signed([head], covering: 4).signedHeads.isEmpty)
        var bytes = signed([head]).bytes
        let at = bytes.count - 64 - SignedHead.size + 16
        bytes[at + 7] ^= 1
        #expect(throws: SyncRejection.self) { try SnapshotManifest(bytes: bytes) }
        // Another device's key over the writer's origin id cannot verify; a valid signature under a key the log does
        // not list for the origin refuses the snapshot.
        let forged = try SignedHead(bytes: (head.bytes.prefix(56) + DeviceIdentity().publicKeys.signing + head.signature)[...])
        #expect(throws: SyncRejection.badSnapshot) { try check(signed([forged]), peer: writer.publicKeys) }
        // A signature that does not verify passes the cheap checks made before any piece, and fails the install's.
        var tampered = head.bytes
        tampered[tampered.count - 1] ^= 1
        let bad = signed([try SignedHead(bytes: tampered[...])])
        try check(bad, peer: writer.publicKeys)
        #expect(throws: SyncRejection.badHead) { try bad.verifySignedHeads { log.member($0)?.keys.signing } }
        try good.verifySignedHeads { log.member($0)?.keys.signing }
        // A head of an origin the log does not list is refused before any piece.
        let stranger = DeviceIdentity()
        let strangerEntry = SealedEntry.seal(Array("y".utf8), space: key, origin: stranger.nodeID, seq: 1, prev: SealedEntry.genesis)
        let strangers = SnapshotManifest(
            space: space, createdMs: 1, parts: 2, size: 4_000, lastPart: SpaceKey.randomBytes(32),
            heads: [stranger.nodeID: (1, strangerEntry.hash)], signedHeads: [SignedHead(signing: strangerEntry, identity: stranger)],
            identity: writer)
        #expect(strangers.signedHeads.count == 1)
        #expect(throws: SyncRejection.badSnapshot) { try check(strangers, peer: writer.publicKeys) }
    }
}
