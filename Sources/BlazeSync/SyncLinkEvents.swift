import BlazeCRDT
import BlazeCrypto
import BlazeStore

/// Fired down a sync connection's pipeline once its handshake succeeds: the database it serves and that space's key.
struct SyncLinkEstablished {
    let db: BlazeDatabase
    let key: SpaceKey
}

/// Fired by `BatchReceiver` once a received batch is stored: the peer holds `origin`'s entries up to `seq`.
struct PeerHoldsBatch {
    let origin: NodeID
    let seq: UInt64
}
