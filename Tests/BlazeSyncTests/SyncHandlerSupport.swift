import BlazeCRDT
import BlazeCrypto
import BlazeStore
import BlazeTestSupport
import NIOCore
import NIOEmbedded
import NIOWebSocket
import Testing

@testable import BlazeSync

extension Recorder {
    /// The established events seen, as database names.
    var established: [String] { events.compactMap { ($0 as? SyncLinkEstablished)?.db.name } }
    /// The remote devices of the established events seen.
    var devices: [DevicePublicKeys] { events.compactMap { ($0 as? SyncLinkEstablished)?.device } }
}

/// Two devices of one legacy space (shared with a secret token): `a` serves "notes", `b` joined it as "mine".
struct SharedPair {
    let a: Device, b: Device
    let dbA: BlazeDatabase, dbB: BlazeDatabase
    let key: SpaceKey

    init(documents: Int = 0) throws {
        a = try Device()
        b = try Device()
        dbA = try a.store.create("notes")
        for i in 0..<documents { _ = try dbA.apply(.put(collection: "c", id: "d\(i)", doc: ["n": .int(Int64(i))])) }
        dbB = try b.engine.join(token: try a.engine.shareWithSecret(db: dbA), name: "mine")
        key = try #require(try b.engine.spaceKey(db: dbB))
    }

    /// The space of `db` on `device` as sync sees it, holding `key` (another key than the space's, to test refusals).
    func space(_ device: Device, _ db: BlazeDatabase, _ key: SpaceKey) -> BlazeSync.SharedSpace {
        BlazeSync.SharedSpace(db: db, id: key.id, identity: device.identity, ops: [], stored: key, capability: nil)
    }

    func close() async {
        await a.close()
        await b.close()
    }
}

/// Runs `body` over a new shared space, then closes the space. The body is synchronous so that the embedded channels
/// it makes live and die on the thread that made them (an `EmbeddedEventLoop` must not be touched from another).
func withSharedSpace(documents: Int = 0, _ body: (SharedPair) throws -> Void) async throws {
    let s = try SharedPair(documents: documents)
    do {
        try body(s)
    } catch {
        await s.close()
        throw error
    }
    await s.close()
}
