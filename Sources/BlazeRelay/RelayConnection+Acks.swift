import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import NIOCore

/// Acknowledgements through the relay (SYNC.md §11): kept when the log vouches for their signers, passed on to the
/// space's other devices, and sent to each device that lacks them.
extension RelayConnection {
    /// Sends the device the acknowledgements held for its space that are newer than those it holds.
    func sendHeldAcks(space: SpaceID, context: ChannelHandlerContext) {
        run(context: context, { try await $0.store.acks(space: space) }) { connection, acks, context in
            connection.sendAcks(acks, context: context)
        }
    }

    /// Sends those of `acks` newer than what the device holds of their signers, in messages of at most 1 MiB.
    func sendAcks(_ acks: [Acknowledgement], context: ChannelHandlerContext) {
        guard access == .member else { return }
        let fresh = acks.filter { ack in acksShared[ack.node].map { ack.issuedMs > $0 } ?? true }
        guard !fresh.isEmpty else { return }
        var chunk: [Acknowledgement] = []
        var bytes = 0
        for ack in fresh {
            acksShared[ack.node] = ack.issuedMs
            if bytes + ack.bytes.count > 1 << 20, !chunk.isEmpty {
                send(.acks(chunk), context: context)
                (chunk, bytes) = ([], 0)
            }
            chunk.append(ack)
            bytes += ack.bytes.count
        }
        send(.acks(chunk), context: context)
    }

    /// Keeps the device's acknowledgements that the log vouches for and that are newer than those held, and passes
    /// them on to the space's other devices (SYNC.md §11): members that meet only through the relay learn what each
    /// other holds.
    func keep(acks: [Acknowledgement], space: SpaceID, context: ChannelHandlerContext) {
        run(context: context, { relay -> (accepted: [Acknowledgement], kept: [Acknowledgement]) in
            let accepted = RelayRules.acceptableAcks(acks, space: space, membership: try await relay.membership(space))
            return (accepted, try await relay.store.keepAcks(accepted, space: space))
        }) { connection, result, context in
            connection.storing = false
            for ack in result.accepted {
                connection.acksShared[ack.node] = max(connection.acksShared[ack.node] ?? 0, ack.issuedMs)
            }
            if !result.kept.isEmpty {
                connection.relay.record(.acksKept(result.kept.count))
                connection.relay.announce(space: space, except: connection.listener, .acks(result.kept))
            }
            connection.resumeReading(context: context)
            connection.storeNext(space: space, context: context)
        }
    }
}
