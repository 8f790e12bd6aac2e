import BlazeProtocol
import Logging
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
        other.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        #expect(other.isActive)
        _ = try other.finish()
    }

    /// An `RPCHandler` over a daemon opened in a temporary directory (not listening), on an `EmbeddedChannel`, alone
    /// on its loop. Only methods answered on the loop are sent: the embedded loop runs on the test's thread.
    func rpcChannel(_ dir: TempDir) throws -> (EmbeddedChannel, Daemon) {
        let loop = EmbeddedEventLoop()
        return try rpcChannel(dir, loop: loop, onLoop: NIOLoopBoundBox(0, eventLoop: loop))
    }

    /// `rpcChannel(_:)` on `loop`, whose connections `onLoop` counts.
    func rpcChannel(_ dir: TempDir, loop: EmbeddedEventLoop, onLoop: NIOLoopBoundBox<Int>) throws -> (EmbeddedChannel, Daemon) {
        var config = DaemonConfig(socketPath: dir.path + "/unused.sock", dataDirectory: dir.path + "/data")
        config.defaultDatabase = "main"
        let daemon = try Daemon(config: config, logger: Logger(label: "test"))
        let context = RequestContext(
            store: daemon.store, config: config, logger: daemon.logger, startedAt: .now, connections: daemon.connections,
            sync: daemon.sync, blobs: daemon.blobs)
        let connection = ConnectionHandle(id: 1, maxSubscriptions: 4, table: daemon.connections)
        let handler = RPCHandler(
            connection: connection, dispatcher: Dispatcher(context: context, pool: daemon.pool), limits: config.limits,
            logger: daemon.logger, loopConnections: onLoop)
        let channel = EmbeddedChannel(handler: handler, loop: loop)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return (channel, daemon)
    }

    func responses(_ channel: EmbeddedChannel) throws -> [JSONValue] {
        var out: [JSONValue] = []
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) {
            for line in String(buffer: buffer).split(separator: "\n") { out.append(try JSONParser().parse(String(line))) }
        }
        return out
    }

    @Test func rpcHandlerAnswersWhatItReceivedThenClosesWhenTheDaemonQuiesces() throws {
        let dir = TempDir()
        let (channel, daemon) = try rpcChannel(dir)
        defer { daemon.store.closeAll() }
        try channel.writeInbound(
            InboundFrame.line(ByteBuffer(string: #"{"jsonrpc":"2.0","id":7,"method":"doc.get","params":{"db":"main","collection":"c","id":"x"}}"#)))
        channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        let answers = try responses(channel)
        #expect(answers.count == 1)
        #expect(answers.first?["id"] == .int(7))
        #expect(!channel.isActive)
    }

    @Test func rpcHandlerStaysOpenOnOtherEventsAndClosesAtOnceWhenIdleAndQuiesced() throws {
        let dir = TempDir()
        let (channel, daemon) = try rpcChannel(dir)
        defer { daemon.store.closeAll() }
        channel.pipeline.fireUserInboundEventTriggered(IdleStateHandler.IdleStateEvent.write)
        #expect(channel.isActive)
        channel.pipeline.fireUserInboundEventTriggered(ChannelShouldQuiesceEvent())
        #expect(try responses(channel).isEmpty)
        #expect(!channel.isActive)
    }

    @Test func aConnectionAloneOnItsLoopHasItsWriteCommittedAndAnsweredWithinTheRead() throws {
        let dir = TempDir()
        let loop = EmbeddedEventLoop()
        let onLoop = NIOLoopBoundBox(0, eventLoop: loop)
        let (channel, daemon) = try rpcChannel(dir, loop: loop, onLoop: onLoop)
        defer { daemon.store.closeAll() }
        #expect(onLoop.value == 1)
        let before = try daemon.store.database("main").groupCommitCounts
        // Answered before `writeInbound` returns, with no loop task run and nothing waited for: committed right here.
        try channel.writeInbound(
            InboundFrame.line(ByteBuffer(string: #"{"jsonrpc":"2.0","id":1,"method":"doc.insert","params":{"db":"main","collection":"c","doc":{"_id":"a","n":1}}}"#)))
        let inserted = try responses(channel)
        #expect(inserted.count == 1)
        #expect(inserted.first?["result"]?["id"] == "a")
        let after = try daemon.store.database("main").groupCommitCounts
        #expect(after.groups == before.groups + 1 && after.writes == before.writes + 1)
        try channel.writeInbound(
            InboundFrame.line(ByteBuffer(string: #"{"jsonrpc":"2.0","id":2,"method":"doc.get","params":{"db":"main","collection":"c","id":"a"}}"#)))
        #expect(try responses(channel).first?["result"]?["doc"]?["n"] == .int(1))
        // A refused write is answered the same way, and the next line is still served.
        try channel.writeInbound(
            InboundFrame.line(ByteBuffer(string: #"{"jsonrpc":"2.0","id":3,"method":"doc.insert","params":{"db":"main","collection":"c","doc":{"_id":"a"}}}"#)))
        try channel.writeInbound(
            InboundFrame.line(ByteBuffer(string: #"{"jsonrpc":"2.0","id":4,"method":"doc.put","params":{"db":"main","collection":"c","id":"b","doc":{}}}"#)))
        let answers = try responses(channel)
        #expect(answers.map { $0["id"] } == [.int(3), .int(4)])
        #expect(answers.first?["error"]?["code"] == .int(Int64(RPCErrorCode.conflict)))
        #expect(answers.last?["result"]?["created"] == true)
        // Closing the connection leaves the loop to others (its handlers are removed in a later loop task).
        try channel.close().wait()
        loop.run()
        #expect(onLoop.value == 0)
    }

    @Test func connectionTableEnforcesItsLimitAndRefusesAllOnceShuttingDown() throws {
        let table = ConnectionTable()
        guard case .admitted(let first) = table.admit(max: 2) else { Issue.record("first refused"); return }
        guard case .admitted(let second) = table.admit(max: 2) else { Issue.record("second refused"); return }
        #expect(first != second)
        #expect(table.admit(max: 2) == .full)
        table.remove(first)
        #expect(table.count == 1)
        table.beginShutdown()
        #expect(table.admit(max: 2) == .closing)
        #expect(table.count == 1)
    }
}
