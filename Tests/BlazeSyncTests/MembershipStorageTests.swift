import BlazeCrypto
import BlazeStore
import Foundation
import Testing

@testable import BlazeSync

/// Operations a peer or a folder sends are stored before the space takes them (`SharedSpace.merge(_:aside:storing:)`):
/// this device's next operation takes its parents from the space, so it can never be stored before a parent it names.
@Suite struct MembershipStorageTests {
    @Test func operationsFromAPeerAreStoredBeforeTheSpaceTakesThem() async throws {
        let a = try Device()
        do {
            let db = try a.store.create("team")
            _ = try a.engine.share(db: db)
            let space = try #require(try a.engine.space(db: db))
            let heads = try #require(space.snapshot.membership?.heads)
            // An admin's operation (this device's own key, as a second device of the same admin would sign it).
            let op = try MembershipOp(space: space.id, author: a.identity, timeMs: 5_000, parents: heads, action: .grant)
            var aside = SetAsideOps()
            let fresh = try space.merge([op], aside: &aside, storing: true)
            #expect(fresh.map(\.hash) == [op.hash])
            // Stored when the space holds it: nothing else (no `persist`) ran.
            #expect(try db.membershipOps().contains(op.bytes))
            #expect(space.snapshot.membership?.heads == [op.hash])
            // Merged without storing (this device's own operations, which their maker stores first), it is not.
            let next = try MembershipOp(space: space.id, author: a.identity, timeMs: 5_001, parents: [op.hash], action: .grant)
            #expect(space.merge([next]).map(\.hash) == [next.hash])
            #expect(try !db.membershipOps().contains(next.bytes))
        } catch {
            await a.close()
            throw error
        }
        await a.close()
    }
}
