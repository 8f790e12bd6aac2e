// The store's own part of sync: the space a shared database records, and its peers.

import BlazeCRDT
import BlazeCrypto
import Testing

@testable import BlazeStore

/// A device: its identity and a store whose node id is derived from it, holding database "s".
final class SyncReplica {
    let identity = DeviceIdentity()
    let temp: TempStore
    let db: BlazeDatabase

    init(key: SpaceKey, limits: StoreLimits = StoreLimits()) throws {
        temp = try TempStore(limits: limits, node: NodeID(bytes: identity.nodeID))
        db = try temp.store.create("s")
        try db.setSpaceID(key.idHex)
    }
}

/// What the store records for sync on its own: the space a database is shared in, and its peers. The log's entries
/// are tested through BlazeSync, which seals and verifies them (BlazeSyncTests).
@Suite struct SyncLogStorageTests {
    let key = SpaceKey.generate()

    @Test func spaceAndPeersAreRecorded() throws {
        let a = try SyncReplica(key: key)
        #expect(try a.db.spaceID() == key.idHex)
        try a.db.setSpaceID(key.idHex)
        expectStoreError("already_shared") { try a.db.setSpaceID(SpaceKey.generate().idHex) }
        let added = try a.db.addPeer("127.0.0.1:9000"), again = try a.db.addPeer("127.0.0.1:9000")
        #expect(added && !again)
        #expect(try a.db.peers() == ["127.0.0.1:9000"])
        let removed = try a.db.removePeer("127.0.0.1:9000"), removedAgain = try a.db.removePeer("127.0.0.1:9000")
        #expect(removed && !removedAgain)
    }
}
