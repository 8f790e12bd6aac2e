import BlazeClient
import BlazeProtocol
import Testing

/// The daemon splices `subscription` notifications from stored document text (no parse per event); these tests hold
/// every kind of them to the generated `RPCNotification.Subscription`, the protocol document's definition.
@Suite struct SubscriptionWireTests {
    /// Every event type a subscription reports, and the final error, decode as the generated notification.
    @Test func everyNotificationDecodesAsTheGeneratedType() throws {
        let d = try DaemonProcess()
        let c = try d.connect(), writer = try d.connect()
        _ = try c.call("db.create", ["db": "w"])
        let live = try c.call(RPC.Subscribe(db: "w", collection: "t", where: ["open": true]))
        let all = try c.call(RPC.Subscribe(db: "w"))
        let steps: [(String, [String: JSONValue])] = [
            ("doc.put", ["db": "w", "collection": "t", "id": "a", "doc": ["open": true, "n": 1]]),  // insert
            ("doc.patch", ["db": "w", "collection": "t", "id": "a", "set": ["n": 2]]),  // update
            ("doc.patch", ["db": "w", "collection": "t", "id": "a", "set": ["open": false]]),  // leave
            ("doc.patch", ["db": "w", "collection": "t", "id": "a", "set": ["open": true]]),  // enter
            ("doc.delete", ["db": "w", "collection": "t", "id": "a"]),  // delete
        ]
        for (method, params) in steps { _ = try writer.call(method, params) }
        var seen: [String: [RPCSchema.Event]] = [:]
        while (seen[live.subscription]?.count ?? 0) < 5 || (seen[all.subscription]?.count ?? 0) < 5 {
            let n = try c.nextNotification(RPCNotification.Subscription.self)
            #expect(n.error == nil)
            seen[n.subscription, default: []] += try #require(n.events)
        }
        #expect(seen[live.subscription]?.map(\.type) == [.insert, .update, .leave, .enter, .delete])
        #expect(seen[all.subscription]?.map(\.type) == [.insert, .update, .update, .update, .delete])
        let inserted = try #require(seen[live.subscription]?.first)
        #expect(inserted.doc == ["_id": "a", "n": 1, "open": true] && inserted.collection == "t" && inserted.id == "a")
        #expect(seen[live.subscription]?.last?.doc == nil, "a delete carries no document")

        _ = try writer.call("db.drop", ["db": "w"])
        var ended: Set<String> = []
        while ended.count < 2 {
            let n = try c.nextNotification(RPCNotification.Subscription.self)
            let error = try #require(n.error)
            #expect(n.events == nil && error.code == -32010 && error.data["kind"] == "database_dropped")
            ended.insert(n.subscription)
        }
        #expect(ended == [live.subscription, all.subscription])
        d.stop()
    }
}
