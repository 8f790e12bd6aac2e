import BlazeCrypto
import BlazeProtocol
import Foundation

/// Joins through a relay (Protocol/RELAY.md, "Joins"): a joiner's `JOIN` is held in the store, where every relay
/// process sees it, for as long as the joiner's connection stays open (at most `joinLifetimeMs`), and passed to the
/// space's admins on whichever process they are connected to; the issuing admin's `JOIN_REFUSED` goes back the same
/// way to the joiner's connection alone.
extension RelayServer {
    /// How long a join is held at most: a joiner waits 20 s to be admitted and sends its join again on every
    /// connection, so a join outlives its connection (dropped on close) only when its process died.
    static let joinLifetimeMs: Int64 = 120_000
    /// Joins held per space at most; a new one makes room by dropping the oldest.
    static let maxJoinsPerSpace = 64

    /// Holds `join` where every process sees it, then tells the space's connections here (other processes are told by
    /// the store).
    func hold(_ join: HeldJoin, space: SpaceID) async throws {
        try await store.holdJoin(join, space: space, limit: Self.maxJoinsPerSpace, nowMs: Self.nowMs())
        await joinsChanged(space: space)
    }

    /// Marks a held join refused, then tells the space's connections here; false when no such join is held.
    func refuse(invite: [UInt8], device: [UInt8], reason: InviteRefusal, space: SpaceID) async throws -> Bool {
        guard try await store.refuseJoin(space: space, invite: invite, device: device, reason: reason) else { return false }
        await joinsChanged(space: space)
        return true
    }

    /// Reads the space's joins once and hands them, with its log, to every connection of the space in this process.
    func joinsChanged(space: SpaceID) async {
        guard isListened(space: space) else { return }
        do {
            let joins = try await store.joins(space: space, nowMs: Self.nowMs())
            announce(space: space, except: nil, .joins(joins, try await membership(space)))
        } catch {
            logger.warning("Relay could not read the joins of a space", metadata: ["space": "\(space.hex)", "error": "\(error)"])
        }
    }

    /// Unix ms now.
    static func nowMs() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }
}
