import BlazeProtocol
import Foundation
import GRDB

/// An invite this device issued, as `db.invites` style listings show it (the secret is never kept).
public struct InviteRecord: Sendable, Equatable {
    /// The invite's id (16 bytes).
    public let id: [UInt8]
    /// The role the joiner gets.
    public let role: String
    /// When it was issued (Unix ms).
    public let createdAtMs: Int64
    /// When it stops working (Unix ms).
    public let expiresAtMs: Int64
    /// When it was redeemed, nil while unused.
    public let usedAtMs: Int64?
}

/// The owner of a database's membership log and issued invites as storage (SYNC.md §9): the `sync_membership` and
/// `sync_invites` tables. Operations are opaque signed bytes that BlazeSync decodes, checks and resolves; the store
/// only keeps them, deduplicated by hash. It holds no state of its own beyond those tables: a value made on demand
/// (`BlazeDatabase.membershipStore`).
public struct MembershipStore: Sendable {
    /// The database whose membership log this is.
    let database: BlazeDatabase

    /// The membership log of `database`.
    init(_ database: BlazeDatabase) { self.database = database }

    /// Every membership operation held, as received (any order).
    public func membershipOps() throws -> [[UInt8]] {
        try database.read { db in try Data.fetchAll(db, sql: "SELECT bytes FROM sync_membership").map { Array($0) } }
    }

    /// Stores operations (already verified by the caller) by hash; returns how many were new.
    @discardableResult
    public func addMembershipOps(_ ops: [(hash: [UInt8], bytes: [UInt8])]) throws -> Int {
        guard !ops.isEmpty else { return 0 }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        return try database.connections.write { db in
            var added = 0
            let insert = try db.cachedStatement(
                sql: "INSERT OR IGNORE INTO sync_membership(hash, bytes, received_at) VALUES (?, ?, ?)")
            for op in ops {
                try insert.execute(arguments: [Data(op.hash), Data(op.bytes), now])
                added += db.changesCount
            }
            return added
        }
    }

    /// Records a version-2 invite: its id, the verifier of its secret (`InviteToken.verifier`: it checks a join proof
    /// and cannot make one), the role it grants and its expiry.
    public func addInvite(id: [UInt8], verifier: [UInt8], role: String, expiresAtMs: Int64) throws {
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        try database.connections.write { db in
            try db.execute(
                sql: "INSERT INTO sync_invites(id, verifier, proof_version, role, created_at, expires_at) VALUES (?, ?, 2, ?, ?, ?)",
                arguments: [Data(id), Data(verifier), role, now, expiresAtMs])
        }
    }

    /// Every invite issued here, newest first.
    public func invites() throws -> [InviteRecord] {
        try database.read { db in
            try Row.fetchAll(
                db, sql: "SELECT id, role, created_at, expires_at, used_at FROM sync_invites ORDER BY created_at DESC, id"
            ).map { row in
                InviteRecord(
                    id: Array(row[0] as Data), role: row[1], createdAtMs: row[2], expiresAtMs: row[3], usedAtMs: row[4])
            }
        }
    }

    /// Redeems invite `id` for `device` in one transaction: checks that the joiner proved the secret (`proves`, given
    /// what was kept of the secret and the invite's proof version), that it is unused and unexpired
    /// at `nowMs`, asks `admit` for the membership operation that adds the device with the invite's role, stores that
    /// operation and marks the invite used. Throws `InviteRefusal` (nothing changes) when the invite does not hold.
    public func redeemInvite(
        id: [UInt8], proves: ([UInt8], Int) -> Bool, device: [UInt8], nowMs: Int64,
        admit: (String) throws -> (hash: [UInt8], bytes: [UInt8])
    ) throws -> String {
        try database.connections.write { db in
            guard
                let row = try Row.fetchOne(
                    db, sql: "SELECT verifier, role, expires_at, used_at, proof_version FROM sync_invites WHERE id = ?",
                    arguments: [Data(id)]),
                proves(Array(row[0] as Data), row[4])
            else { throw InviteRefusal.unknown }
            guard (row[3] as Int64?) == nil else { throw InviteRefusal.used }
            guard nowMs < row[2] as Int64 else { throw InviteRefusal.expired }
            let role: String = row[1]
            let op = try admit(role)
            try db.execute(
                sql: "INSERT OR IGNORE INTO sync_membership(hash, bytes, received_at) VALUES (?, ?, ?)",
                arguments: [Data(op.hash), Data(op.bytes), nowMs])
            try db.execute(
                sql: "UPDATE sync_invites SET used_at = ?, used_by = ? WHERE id = ?",
                arguments: [nowMs, Data(device), Data(id)])
            return role
        }
    }
}

/// The membership log's owner, and the calls BlazeSync makes through the database (forwarded to `MembershipStore`).
extension BlazeDatabase {
    /// The database's membership log and invites as storage.
    public var membershipStore: MembershipStore { MembershipStore(self) }

    /// Every membership operation held, as received (`MembershipStore.membershipOps`).
    public func membershipOps() throws -> [[UInt8]] { try membershipStore.membershipOps() }

    /// Stores verified operations by hash; returns how many were new (`MembershipStore.addMembershipOps`).
    @discardableResult
    public func addMembershipOps(_ ops: [(hash: [UInt8], bytes: [UInt8])]) throws -> Int {
        try membershipStore.addMembershipOps(ops)
    }

    /// Records a version-2 invite (`MembershipStore.addInvite`).
    public func addInvite(id: [UInt8], verifier: [UInt8], role: String, expiresAtMs: Int64) throws {
        try membershipStore.addInvite(id: id, verifier: verifier, role: role, expiresAtMs: expiresAtMs)
    }

    /// Every invite issued here, newest first (`MembershipStore.invites`).
    public func invites() throws -> [InviteRecord] { try membershipStore.invites() }

    /// Redeems invite `id` for `device` in one transaction (`MembershipStore.redeemInvite`).
    public func redeemInvite(
        id: [UInt8], proves: ([UInt8], Int) -> Bool, device: [UInt8], nowMs: Int64,
        admit: (String) throws -> (hash: [UInt8], bytes: [UInt8])
    ) throws -> String {
        try membershipStore.redeemInvite(id: id, proves: proves, device: device, nowMs: nowMs, admit: admit)
    }
}
