import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeTestSupport
import Foundation
import NIOCore
import Testing

@testable import BlazeSync

/// Members flooding a space's membership log (SYNC.md §9, "What the log keeps"), on real engines in one process.
@Suite(.serialized) struct MembershipFloodTests {
    /// A reader signs `BLAZE_FLOOD_OPS` (10,000) grants on the heads it holds, all concurrent, and its session hands
    /// them to the admin. Before the log kept only what an admin signed, each became a head that the admin's next
    /// operation had to name: past 64 no revocation, invite or key grant could be made again, and the resolution of
    /// so many concurrent operations took minutes. The admin still revokes the reader, and a new device joins and
    /// syncs.
    @Test func aReaderFloodingTheLogFreezesNoAdmin() async throws {
        let count = Int(ProcessInfo.processInfo.environment["BLAZE_FLOOD_OPS"] ?? "") ?? 10_000
        let a = try Device(), r = try Device(), n = try Device()
        do {
            try await a.listen()
            let db = try a.store.create("team")
            _ = try a.engine.share(db: db)
            let address = "127.0.0.1:\(a.port)"
            let readerToken = try a.engine.invite(db: db, role: .reader, expiresInMs: 600_000, address: address).token
            let rdb = try r.engine.join(token: readerToken, name: "team")
            let readerSpace = try #require(try r.engine.space(db: rdb))
            let heads = try #require(readerSpace.snapshot.membership?.heads)
            let flood = try (0..<count).map {
                try MembershipOp(space: readerSpace.id, author: r.identity, timeMs: 1_000 + UInt64($0), parents: heads, action: .grant)
            }
            // What a session does with the MEMBERS it receives.
            let space = try #require(try a.engine.space(db: db))
            let started = ContinuousClock.now
            #expect(space.merge(flood).isEmpty, "nothing a reader signs is kept")
            print("merging \(count) operations of a reader took \(ContinuousClock.now - started)")
            #expect(space.snapshot.membership?.heads.count == 1)

            // The admin revokes the reader and admits a new device, which receives what the admin writes.
            _ = try a.engine.revoke(db: db, device: r.identity.publicKeys.nodeIDHex)
            let writerToken = try a.engine.invite(db: db, role: .writer, expiresInMs: 600_000, address: address).token
            let ndb = try n.engine.join(token: writerToken, name: "team")
            _ = try db.apply(.put(collection: "c", id: "after", doc: ["ok": true]))
            #expect(await waitUntil { (try? ndb.stateHash()) == (try? db.stateHash()) && (try? ndb.stateHash()) != nil })
            let members = try a.engine.members(db: db)
            #expect(members.contains { $0.device == r.identity.publicKeys.nodeIDHex && $0.removedBy != nil })
            #expect(members.contains { $0.device == n.identity.publicKeys.nodeIDHex && $0.role == "writer" && $0.removedBy == nil })
        } catch {
            for d in [a, r, n] { await d.close() }
            throw error
        }
        for d in [a, r, n] { await d.close() }
    }
}
