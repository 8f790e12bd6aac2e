import BlazeProtocol
import BlazeStore

/// Live subscriptions of a connection.
extension Methods {
    static let subscribe = MethodHandler(RPC.Subscribe.self, inline: true) { p, ctx in
        guard let connection = ctx.connection else { throw RPCError.internalError() }
        let db = try ctx.database(p.db)
        if let collection = p.collection { try Names.validateCollection(collection) }
        let filter = try p.where.map { try Filter.parse(.object($0)) }
        let start: Int64
        if let since = p.since {
            guard since >= 0 else { throw RPCError.invalidParams("since must be 0 or more, got \(since)") }
            try db.checkFeedPosition(Int64(since))
            start = Int64(since)
        } else {
            start = db.feed.lastSequence
        }
        let sub = Subscription(
            database: db, collection: p.collection, filter: filter, start: start, blobEvents: p.blobs == true ? ctx.blobs.events : nil)
        try connection.add(sub)
        return .init(subscription: sub.id, seq: Int(start))
    }

    static let unsubscribe = MethodHandler(RPC.Unsubscribe.self, inline: true) { p, ctx in
        guard let connection = ctx.connection, connection.remove(p.subscription) != nil else {
            throw RPCError(
                code: RPCErrorCode.notFound, kind: "subscription_not_found",
                message: "this connection has no subscription \"\(p.subscription)\"")
        }
        return .init(subscription: p.subscription)
    }
}
