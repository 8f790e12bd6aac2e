import BlazeCrypto
import BlazeProtocol
import BlazeStore

/// Statements of entry formats (SYNC.md §6, "Entry formats"): each member signs which entry formats it opens, any
/// member passes them on, and a device seals in a newer format only once every current member has stated it opens it.
extension BlazeDatabase {
    /// The entry formats this build opens, as its statement says.
    public static let openedEntryFormats: ClosedRange<UInt8> = EntryHeader.versions

    /// Signs and keeps this device's statement of `openedEntryFormats` unless the one held says the same; true when
    /// it issued one.
    @discardableResult
    public func issueFormatStatement(space: SpaceID, identity: DeviceIdentity, nowMs: UInt64) throws -> Bool {
        let mine = try formatStatements().first { $0.node == identity.nodeID }.flatMap { try? FormatStatement(bytes: $0.bytes) }
        if let mine, mine.space == space, mine.formats == Self.openedEntryFormats { return false }
        let statement = FormatStatement(
            space: space, formats: Self.openedEntryFormats, issuedMs: max(nowMs, (mine?.issuedMs ?? 0) + 1), identity: identity)
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

    /// The entry format this device seals its changes in: the newest every other current member of the log has
    /// stated it opens (this device opens what this build does), and `EntryHeader.version` in a space without a log
    /// or while any member has stated nothing.
    public func sealingFormat(membership: MembershipState?) throws -> UInt8 {
        guard let membership else { return EntryHeader.version }
        let statements = try heldFormatStatements(membership: membership)
        let byNode = Dictionary(statements.map { ($0.node, $0) }, uniquingKeysWith: { a, b in a.issuedMs >= b.issuedMs ? a : b })
        let others = membership.current.map(\.keys.nodeID).filter { $0 != node.bytes }
        return FormatStatement.sealedFormat(members: others, statements: byNode)
    }
}

extension SyncEngine {
    /// The entry format `db`'s changes are sealed in now (`BlazeDatabase.sealingFormat`); nil when it is not shared.
    public func entryFormat(db: BlazeDatabase) throws -> Int? {
        guard let space = try space(db: db) else { return nil }
        return Int(try db.sealingFormat(membership: space.snapshot.membership))
    }
}
