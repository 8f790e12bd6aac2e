import BlazeCrypto
import BlazeProtocol
import BlazeWire
import NIOCore

/// Statements of entry formats through the relay (SYNC.md §6, "Entry formats"): like acknowledgements, kept when the
/// log vouches for their signers, passed on to the space's other devices and sent to each device that lacks them,
/// on protocol 6 or later only.
extension RelayConnection {
    /// The first protocol whose connections carry `FORMATS`.
    static let formatsFrom: UInt8 = 6

    /// Sends the device the statements held for its space that are newer than those it holds.
    func sendHeldFormats(space: SpaceID, context: ChannelHandlerContext) {
        guard protocolVersion >= Self.formatsFrom else { return }
        run(context: context, { try await $0.store.formats(space: space) }) { connection, statements, context in
            connection.sendFormats(statements, context: context)
        }
    }

    /// Sends those of `statements` newer than what the device holds of their signers.
    func sendFormats(_ statements: [FormatStatement], context: ChannelHandlerContext) {
        guard access == .member, protocolVersion >= Self.formatsFrom else { return }
        let fresh = statements.filter { s in formatsShared[s.node].map { s.issuedMs > $0 } ?? true }
        guard !fresh.isEmpty else { return }
        for s in fresh { formatsShared[s.node] = s.issuedMs }
        var rest = fresh[...]
        while !rest.isEmpty {
            send(.formats(Array(rest.prefix(PeerMessage.maxStatements))), context: context)
            rest = rest.dropFirst(PeerMessage.maxStatements)
        }
    }

    /// Keeps the device's statements that the log vouches for and that are newer than those held, and passes them on
    /// to the space's other devices.
    func keep(formats statements: [FormatStatement], space: SpaceID, context: ChannelHandlerContext) {
        run(context: context, { relay -> (accepted: [FormatStatement], kept: [FormatStatement]) in
            let accepted = RelayRules.acceptableFormats(statements, space: space, membership: try await relay.membership(space))
            return (accepted, try await relay.store.keepFormats(accepted, space: space))
        }) { connection, result, context in
            connection.storing = false
            for s in result.accepted {
                connection.formatsShared[s.node] = max(connection.formatsShared[s.node] ?? 0, s.issuedMs)
            }
            if !result.kept.isEmpty { connection.relay.announce(space: space, except: connection.listener, .formats(result.kept)) }
            connection.resumeReading(context: context)
            connection.storeNext(space: space, context: context)
        }
    }
}
