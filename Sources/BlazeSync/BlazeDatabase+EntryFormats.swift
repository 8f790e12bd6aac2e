import BlazeCrypto
import BlazeProtocol
import BlazeStore
import Synchronization

/// Statements of entry formats (SYNC.md §6, "Entry formats"): each member signs which entry formats it can be sent,
/// any member passes them on, and a device seals in a newer format only once every current member has stated it.
extension BlazeDatabase {
    /// The entry formats this build opens.
    public static let openedEntryFormats: ClosedRange<UInt8> = EntryHeader.versions

    /// Signs and keeps this device's statement that it can be sent `formats` unless the one held says the same and
    /// was issued since the device was (last) added to `membership`'s log; true when it issued one.
    @discardableResult
    public func issueFormatStatement(
        space: SpaceID, identity: DeviceIdentity, nowMs: UInt64, formats: ClosedRange<UInt8>, membership: MembershipState?
    ) throws -> Bool {
        let added = membership?.member(identity.nodeID)?.addedAtMs ?? 0
        let mine = try formatStatements().first { $0.node == identity.nodeID }.flatMap { try? FormatStatement(unverified: $0.bytes) }
        if let mine, mine.space == space, mine.formats == formats, mine.issuedMs >= added { return false }
        let statement = FormatStatement(
            space: space, formats: formats, issuedMs: max(nowMs, (mine?.issuedMs ?? 0) + 1, added), identity: identity)
        return try storeFormatStatement(node: statement.node, issuedMs: statement.issuedMs, bytes: statement.bytes)
    }

    /// Keeps the statements of `space` that its log's current members signed (with the key the log lists, since they
    /// were last added) and whose signatures hold; true when any was newer than the one held. The signer is checked
    /// before the signature, so statements of strangers cost nothing. A space without a log keeps none.
    public func keep(_ statements: [FormatStatement], space: SpaceID, membership: MembershipState?) throws -> Bool {
        guard let membership else { return false }
        var kept = false
        for s in statements where s.space == space && Self.vouched(s, by: membership) && s.isSigned {
            if try storeFormatStatement(node: s.node, issuedMs: s.issuedMs, bytes: s.bytes) { kept = true }
        }
        return kept
    }

    /// True when `membership` lists the statement's signer as a current member with that key, and the statement was
    /// issued since the member was (last) added: one from before a removal says nothing of the device re-added.
    static func vouched(_ s: FormatStatement, by membership: MembershipState) -> Bool {
        guard s.space == membership.space, let m = membership.member(s.node), m.isCurrent, m.keys.signing == s.deviceKey else {
            return false
        }
        return s.issuedMs >= m.addedAtMs
    }

    /// The statements held of the current members `membership` lists (kept only once verified, so read back by their
    /// shape alone).
    public func heldFormatStatements(membership: MembershipState?) throws -> [FormatStatement] {
        guard let membership else { return [] }
        return try formatStatements().compactMap { held in
            guard let s = try? FormatStatement(unverified: held.bytes), Self.vouched(s, by: membership) else { return nil }
            return s
        }
    }

    /// The entry format this device seals its changes in: the newest every current member of the log has stated it
    /// can be sent (this device: what it can be sent now, `receivableFormats`, whatever its statement said), and
    /// `EntryHeader.version` in a space without a log or while any other member has stated nothing.
    public func sealingFormat(membership: MembershipState?) throws -> UInt8 {
        guard let membership, try receivableFormats(speaking: SyncProtocols.spoken).upperBound > EntryHeader.version else {
            return EntryHeader.version
        }
        let statements = try heldFormatStatements(membership: membership)
        let byNode = Dictionary(statements.map { ($0.node, $0) }, uniquingKeysWith: { a, b in a.issuedMs >= b.issuedMs ? a : b })
        let me = node.bytes
        let members = membership.current.map(\.keys.nodeID).filter { $0 != me || byNode[me] != nil }
        return FormatStatement.sealedFormat(members: members, statements: byNode)
    }

    /// The entry formats this device can be sent: what this build opens, unless it speaks no protocol that carries
    /// format 3 (`SyncSession.formatsFrom`), or one of the relays it dials has not answered in such a protocol since
    /// it was added (a relay of an earlier build refuses entries of format 3 as malformed, so nothing of that format
    /// may need to pass through it; one not reached yet counts as such until it answers).
    public func receivableFormats(speaking protocols: ClosedRange<UInt8>) throws -> ClosedRange<UInt8> {
        let older = Self.openedEntryFormats.lowerBound...EntryHeader.version
        guard protocols.upperBound >= SyncSession.formatsFrom else { return older }
        let answered = try relayProtocols()
        let relays = try peers().filter { $0.hasPrefix("ws://") || $0.hasPrefix("wss://") }
        return relays.allSatisfy { (answered[$0] ?? 0) >= Int(SyncSession.formatsFrom) } ? Self.openedEntryFormats : older
    }
}

extension SyncEngine {
    /// The entry format `db`'s changes are sealed in now (`BlazeDatabase.sealingFormat`); nil when it is not shared.
    public func entryFormat(db: BlazeDatabase) throws -> Int? {
        guard let space = try space(db: db) else { return nil }
        return Int(try db.sealingFormat(membership: space.snapshot.membership))
    }

    /// Issues this device's statement for `db` when what it can be sent changed (`receivableFormats`), with what it
    /// reads and what it issues taken together under one lock, so a narrower statement is never followed by a wider
    /// one computed before it. Call off the event loops. True when it issued one.
    @discardableResult
    func issueFormatStatement(db: BlazeDatabase, space: SharedSpace) throws -> Bool {
        try statementIssuing.withLock { _ in
            let formats = try db.receivableFormats(speaking: SyncProtocols.spoken)
            return try db.issueFormatStatement(
                space: space.id, identity: identity, nowMs: nowMsUnsigned(), formats: formats, membership: space.snapshot.membership)
        }
    }
}
