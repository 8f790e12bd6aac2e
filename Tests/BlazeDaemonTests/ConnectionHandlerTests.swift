import BlazeProtocol
import NIOCore
import NIOEmbedded
import Testing

@testable import BlazeDaemon

/// The daemon's small connection handlers, each alone in an `EmbeddedChannel`.
@Suite struct ConnectionHandlers {
    func frames(_ channel: EmbeddedChannel) throws -> [String] {
        var out: [String] = []
        while let frame = try channel.readInbound(as: InboundFrame.self) {
            switch frame {
            case .line(let b): out.append(String(buffer: b))
            case .tooLong: out.append("<too long>")
            }
        }
        return out
    }

    @Test func lineDecoderSplitsLinesAcrossReadsAndStripsCarriageReturns() throws {
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(LineFrameDecoder(maxLength: 16)))
        try channel.writeInbound(ByteBuffer(string: "{\"a\":1}\r\n{\"b\""))
        #expect(try frames(channel) == ["{\"a\":1}"])
        try channel.writeInbound(ByteBuffer(string: ":2}\n\n"))
        #expect(try frames(channel) == ["{\"b\":2}", ""])
        _ = try channel.finish()
    }

    @Test func lineDecoderReportsAnOverlongLineOnceAndDiscardsTheRest() throws {
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(LineFrameDecoder(maxLength: 8)))
        try channel.writeInbound(ByteBuffer(string: "ok\n" + String(repeating: "x", count: 20)))
        #expect(try frames(channel) == ["ok", "<too long>"])
        try channel.writeInbound(ByteBuffer(string: "more\nand more\n"))
        #expect(try frames(channel) == [])
        _ = try channel.finish()
    }

    @Test func refuseHandlerWritesItsLineThenCloses() throws {
        let channel = EmbeddedChannel(handler: RefuseHandler(line: Array("{\"error\":1}\n".utf8)))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        let written = try #require(try channel.readOutbound(as: ByteBuffer.self))
        #expect(String(buffer: written) == "{\"error\":1}\n")
        #expect(!channel.isActive)
    }

    @Test func idleCloserClosesOnlyConnectionsWithoutSubscriptions() throws {
        let table = ConnectionTable()
        let idle = EmbeddedChannel(handler: IdleCloser(connection: ConnectionHandle(id: 1, maxSubscriptions: 4, table: table)))
        try idle.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        idle.pipeline.fireUserInboundEventTriggered(IdleStateHandler.IdleStateEvent.read)
        #expect(!idle.isActive)

        // Other events pass through untouched.
        let other = EmbeddedChannel(handler: IdleCloser(connection: ConnectionHandle(id: 2, maxSubscriptions: 4, table: table)))
        try other.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        other.pipeline.fireUserInboundEventTriggered(RPCHandler.Shutdown())
        #expect(other.isActive)
        _ = try other.finish()
    }

    @Test func connectionTableEnforcesItsLimitAndRefusesAllOnceShuttingDown() throws {
        let table = ConnectionTable()
        let a = EmbeddedChannel(), b = EmbeddedChannel(), c = EmbeddedChannel()
        let first = try #require(table.add(a, max: 2))
        #expect(table.add(b, max: 2) != nil)
        #expect(table.add(c, max: 2) == nil)
        table.remove(first)
        #expect(table.count == 1)
        #expect(table.beginShutdown().count == 1)
        #expect(table.add(c, max: 2) == nil)
    }
}
