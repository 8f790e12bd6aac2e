import BlazeCRDT
import BlazeCrypto
import BlazeStore

/// Fired down a sync connection's pipeline once its handshake succeeds: the space it serves and the device at the
/// other end (proven by its signature in the handshake).
struct SyncLinkEstablished {
    let space: SharedSpace
    let device: DevicePublicKeys
    /// The protocol version both ends agreed on (SYNC.md §8, "Versions").
    let protocolVersion: UInt8

    /// The database served.
    var db: BlazeDatabase { space.db }
    /// The space's keys now (they change when the membership log rotates them).
    var key: SpaceKey { space.key }
}

/// Fired by `BatchReceiver` once a received batch verified, before it is stored: the peer holds `origin`'s entries up
/// to `seq`.
struct PeerHoldsBatch {
    let origin: NodeID
    let seq: UInt64
}

/// Fired by `BatchReceiver` once it merged membership operations the peer sent into the space: those `fresh` were new.
struct MergedOps {
    let received: [MembershipOp]
    let fresh: [MembershipOp]
}

/// Fired by `BatchReceiver` when it refused a batch for a reason that may clear (`SyncRejection.mayClear`): the
/// session ends a while later, so that the link's next connection fetches it again.
struct RefusedForNow {
    let reason: SyncRejection
}

/// Fired by `BatchReceiver` when it refused a batch it could not open (`unknown_epoch`, `bad_seal`) with `held` entry
/// keys: should more keys arrive (a `grant` for a rotation this device missed), the session reconnects to fetch it
/// again.
struct AwaitingKeys {
    let held: Int
}
