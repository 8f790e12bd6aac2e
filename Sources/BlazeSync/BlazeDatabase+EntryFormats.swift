import BlazeCrypto
import BlazeProtocol
import BlazeStore

/// Statements of entry formats (SYNC.md §6, "Entry formats"): each member signs which entry formats it opens, any
/// member passes them on, and a device seals in a newer format only once every current member has stated it opens it.
extension BlazeDatabase {
    /// The entry formats this build opens, as its statement says.
    public static let openedEntryFormats: ClosedRange<UInt8> = EntryHeader.versions

    /// Signs and keeps this device's statement that it opens `formats` (what it can be sent: `SyncEngine.receivable`)
    /// unless the one held says the same; true when it issued one.
    @discardableResult
    public func issueFormatStatement(
        space: SpaceID, identity: DeviceIdentity, nowMs: UInt64, formats: ClosedRange<UInt8> = openedEntryFormats
    ) throws -> Bool {
        let mine = try formatStatements().first { $0.node == identity.nodeID }.flatMap { try? FormatStatement(bytes: $0.bytes) }
        if let mine, mine.space == space, mine.formats == formats { return false }
        let statement = FormatStatement(
            space: space, formats: formats, issuedMs: max(nowMs, (mine?.issuedMs ?? 0) + 1), identity: identity)
        return try storeFormatStatement(node: statement.node, issuedMs: statement.issuedMs, bytes: statement.bytes)
    }

    /// Keeps the statements of `space` signed by devices its log lists; true when any was newer than the one held. A
    /// space without a log keeps none: it seals only the format every build opens.
    public func keep(_ statements: [FormatStatement], space: SpaceID, membership: MembershipState?) throws -> Bool {
        guard let membership else { return false }
        var kept = false
        for s in statements where s.space == space {
            guard let m = membership.member(s.node), m.keys.signing == s.deviceKey else { continue }
            if try storeFormatStatement(node: s.node, issuedMs: s.issuedMs, bytes: s.bytes) { kept = true }
        }
        return kept
    }

    /// The statements held of the members `membership` lists (each verified again: a few per space).
    public func heldFormatStatements(membership: MembershipState?) throws -> [FormatStatement] {
        guard let membership else { return [] }
        return try formatStatements().compactMap { held in
            guard let s = try? FormatStatement(bytes: held.bytes), let m = membership.member(s.node), m.keys.signing == s.deviceKey
            else { return nil }
            return s
        }
    }

    /// The entry format this device seals its changes in: the newest every current member of the log has stated it
    /// can be sent (this device, until it has issued a statement, what this build opens), and `EntryHeader.version`
    /// in a space without a log or while any other member has stated nothing.
    public func sealingFormat(membership: MembershipState?) throws -> UInt8 {
        guard let membership else { return EntryHeader.version }
        let statements = try heldFormatStatements(membership: membership)
        let byNode = Dictionary(statements.map { ($0.node, $0) }, uniquingKeysWith: { a, b in a.issuedMs >= b.issuedMs ? a : b })
        let me = node.bytes
        let members = membership.current.map(\.keys.nodeID).filter { $0 != me || byNode[me] != nil }
        return FormatStatement.sealedFormat(members: members, statements: byNode)
    }
}

extension SyncEngine {
    /// The entry formats this device can be sent in `db`'s space: what this build opens, unless one of its relays
    /// last spoke a protocol before 6 (such a relay refuses entries of format 3 as malformed, so nothing of that format
    /// may need to pass through it). A relay not reached yet does not count until it answers.
    public func receivable(db: BlazeDatabase) -> ClosedRange<UInt8> {
        let oldRelay = status(db: db).contains { s in
            s.direction == .outbound && (s.peer.hasPrefix("ws://") || s.peer.hasPrefix("wss://"))
                && (s.protocolVersion ?? Int(SyncSession.formatsFrom)) < Int(SyncSession.formatsFrom)
        }
        return oldRelay ? BlazeDatabase.openedEntryFormats.lowerBound...EntryHeader.version : BlazeDatabase.openedEntryFormats
    }

    /// The entry format `db`'s changes are sealed in now (`BlazeDatabase.sealingFormat`); nil when it is not shared.
    public func entryFormat(db: BlazeDatabase) throws -> Int? {
        guard let space = try space(db: db) else { return nil }
        return Int(try db.sealingFormat(membership: space.snapshot.membership))
    }
}
