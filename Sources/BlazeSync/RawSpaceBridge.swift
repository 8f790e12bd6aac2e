import BlazeCrypto
import BlazeProtocol
import BlazeStore

// Bridges for the files the BlazeStore refactor is changing at the same time (BlazeDatabase+Snapshot.swift,
// BlazeDatabase+SyncLog.swift, SyncEngine+Compaction.swift): they still take a space id as its raw 16 bytes. Remove
// once those files take `SpaceID`.

extension SpaceID {
    /// Whether `raw` is this id's bytes.
    static func == (id: SpaceID, raw: [UInt8]) -> Bool { id.bytes == raw }
}

extension Acknowledgement {
    /// `init(space:vector:issuedMs:identity:lacking:)` for a local space id held as bytes (always 16).
    init(space: [UInt8], vector: [[UInt8]: UInt64], issuedMs: UInt64, identity: DeviceIdentity, lacking: [EpochKeyID] = []) {
        self.init(space: SpaceID(computed: space), vector: vector, issuedMs: issuedMs, identity: identity, lacking: lacking)
    }
}

extension BlazeDatabase {
    /// Stores verified membership operations by hash; returns how many were new.
    @discardableResult
    func addMembershipOps(_ ops: [MembershipOp]) throws -> Int {
        try addMembershipOps(ops.map { ($0.hash.bytes, $0.bytes) })
    }
}
