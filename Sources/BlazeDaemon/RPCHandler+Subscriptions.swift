import BlazeProtocol
import BlazeStore
import NIOCore

/// Subscription delivery: replay from the durable feed in pages, then live events, with back-pressure.
extension RPCHandler {
    /// Catches a subscription up: attaches it to the live feed when nothing is left to replay, else replays one page
    /// from the durable feed on the I/O pool and comes back.
    func pump(_ id: String, context: ChannelHandlerContext) {
        guard let d = deliveries[id], connection.contains(d.sub) else {
            deliveries[id] = nil
            return
        }
        let sub = d.sub
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let attachment = sub.database.feed.attach(after: d.delivered) { signal in
            loopBound.eventLoop.execute {
                let (handler, context) = loopBound.value
                handler.receive(signal, for: sub, context: context)
            }
        }
        switch attachment {
        case .attached(let token):
            sub.attached(token)
        case .ended(let error):
            end(sub, Dispatcher.rpcError(error) ?? .internalError(), context: context)
        case .behind:
            let after = d.delivered
            dispatcher.pool.runIfActive(eventLoop: context.eventLoop) {
                try sub.database.feedEntries(after: after)
            }.whenComplete { result in
                let (handler, context) = loopBound.value
                guard handler.deliveries[sub.id] != nil, !sub.isCancelled else { return }
                switch result {
                case .success(let entries):
                    handler.write(entries, for: sub, context: context)
                    if context.channel.isWritable {
                        handler.pump(sub.id, context: context)
                    } else {
                        handler.deliveries[sub.id]?.waiting = true
                    }
                case .failure(let error as StoreError):
                    handler.end(sub, Dispatcher.rpcError(error) ?? .internalError(), context: context)
                case .failure(let error):
                    handler.logger.error(
                        "Subscription replay failed",
                        metadata: ["connection.id": "\(handler.id)", "subscription": "\(sub.id)", "error": "\(error)"])
                    handler.end(sub, .internalError(), context: context)
                }
            }
        }
    }

    /// A live signal from the feed (on this loop, in commit order).
    func receive(_ signal: FeedSignal, for sub: Subscription, context: ChannelHandlerContext) {
        guard deliveries[sub.id]?.sub === sub, !sub.isCancelled else { return }
        switch signal {
        case .entries(let entries):
            let backlog = (try? context.channel.syncOptions?.getOption(.bufferedWritableBytes)) ?? 0
            dispatcher.context.metrics?.subscriberBacklog(bytes: backlog)
            if backlog > limits.maxSubscriberBacklogBytes {
                dispatcher.context.metrics?.subscribersDropped.increment()
                logger.notice(
                    "Dropping a subscriber that does not keep up",
                    metadata: ["connection.id": "\(id)", "subscription": "\(sub.id)", "backlog.bytes": "\(backlog)"])
                end(
                    sub,
                    RPCError(
                        code: RPCErrorCode.limitExceeded, kind: "subscriber_too_slow",
                        message: "more than \(limits.maxSubscriberBacklogBytes) bytes were waiting for this connection "
                            + "to read them; the subscription is dropped: subscribe again with since to resume",
                        details: ["lastSeq": .int(deliveries[sub.id]?.delivered ?? sub.start)]),
                    context: context)
                return
            }
            write(entries, for: sub, context: context)
        case .ended(let error), .reset(let error):
            end(sub, Dispatcher.rpcError(error) ?? .internalError(), context: context)
        }
    }

    /// Writes the events of `entries` not yet delivered to `sub`.
    func write(_ entries: [FeedEntry], for sub: Subscription, context: ChannelHandlerContext) {
        guard let delivered = deliveries[sub.id]?.delivered else { return }
        let fresh = entries.lazy.filter { $0.seq > delivered }
        guard let last = fresh.last?.seq else { return }
        deliveries[sub.id]?.delivered = last
        if let line = sub.notification(fresh) {
            context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: line)), promise: nil)
        }
    }

    /// Passes the database's blob fetch progress to `sub` when it asked for it (`blobs: true`).
    func listenForBlobs(_ sub: Subscription, context: ChannelHandlerContext) {
        guard sub.blobEvents != nil else { return }
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        sub.listenForBlobs { event in
            loopBound.eventLoop.execute {
                let (handler, context) = loopBound.value
                handler.write(event, for: sub, context: context)
            }
        }
    }

    /// Writes blob progress `event` to `sub`. Progress (`fetching`) is left out while the connection has more than
    /// half its backlog waiting; the end of a fetch (held, partial, failed) is not, but past the whole backlog the
    /// subscription ends (`subscriber_too_slow`), as for document events.
    func write(_ event: RPCSchema.BlobProgress, for sub: Subscription, context: ChannelHandlerContext) {
        guard deliveries[sub.id]?.sub === sub, !sub.isCancelled else { return }
        let backlog = (try? context.channel.syncOptions?.getOption(.bufferedWritableBytes)) ?? 0
        if event.state == .fetching, backlog > limits.maxSubscriberBacklogBytes / 2 { return }
        guard backlog <= limits.maxSubscriberBacklogBytes else {
            end(
                sub,
                RPCError(
                    code: RPCErrorCode.limitExceeded, kind: "subscriber_too_slow",
                    message: "more than \(limits.maxSubscriberBacklogBytes) bytes were waiting for this connection to read "
                        + "them; the subscription is dropped: subscribe again with since to resume",
                    details: ["lastSeq": .int(deliveries[sub.id]?.delivered ?? sub.start)]),
                context: context)
            return
        }
        context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: sub.blobNotification(event))), promise: nil)
    }

    /// Ends a subscription with one final error notification.
    func end(_ sub: Subscription, _ error: RPCError, context: ChannelHandlerContext) {
        guard deliveries.removeValue(forKey: sub.id) != nil, connection.remove(sub.id) != nil else { return }
        context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: sub.finalNotification(error))), promise: nil)
    }
}
