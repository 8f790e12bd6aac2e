import BlazeCRDT
import BlazeCrypto
import BlazeStore

/// Fired down a sync connection's pipeline once its handshake succeeds: the database it serves, that space's key and
/// the device at the other end (proven by its signature in the handshake).
struct SyncLinkEstablished {
    let db: BlazeDatabase
    let key: SpaceKey
    let device: DevicePublicKeys
}

/// Fired by `BatchReceiver` once a received batch is stored: the peer holds `origin`'s entries up to `seq`.
struct PeerHoldsBatch {
    let origin: NodeID
    let seq: UInt64
}
