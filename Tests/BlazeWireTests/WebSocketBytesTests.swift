import NIOCore
import NIOEmbedded
import NIOWebSocket
import BlazeTestSupport
import Testing

@testable import BlazeWire

/// `WebSocketBytes`, the stream adapter that carries the peer protocol over a WebSocket (Protocol/RELAY.md,
/// "Transport").
@Suite struct WebSocketBytesTests {
    @Test func webSocketBytesCarryTheStreamAndAnswerControlFrames() throws {
        let channel = EmbeddedChannel()
        let up = Recorder<ByteBuffer>()
        try channel.pipeline.syncOperations.addHandlers([WebSocketBytes(role: .client), up])
        try channel.connect(to: .init(ipAddress: "127.0.0.1", port: 1)).wait()
        // Binary and continuation payloads go up as bytes, empty ones not at all; a masked frame is unmasked.
        let mask = WebSocketMaskingKey.random()
        var masked = ByteBuffer(bytes: [1, 2, 3])
        masked.webSocketMask(mask)
        for frame in [
            WebSocketFrame(fin: false, opcode: .binary, data: ByteBuffer(bytes: [9, 8])),
            WebSocketFrame(fin: true, opcode: .continuation, data: ByteBuffer(bytes: [7])),
            WebSocketFrame(fin: true, opcode: .binary, data: ByteBuffer()),
            WebSocketFrame(fin: true, opcode: .binary, maskKey: mask, data: masked),
        ] { try channel.writeInbound(frame) }
        #expect(up.messages.map { Array($0.readableBytesView) } == [[9, 8], [7], [1, 2, 3]])
        // A ping is answered with a pong carrying its data.
        try channel.writeInbound(WebSocketFrame(fin: true, opcode: .ping, data: ByteBuffer(bytes: [4, 2])))
        let pong = try #require(try channel.readOutbound(as: WebSocketFrame.self))
        // (Frames written carry their mask key; the encoder below applies it.)
        #expect(pong.opcode == .pong && Array(pong.data.readableBytesView) == [4, 2] && pong.maskKey != nil)
        // What is written goes out as masked binary messages of at most chunkSize bytes, in order.
        let payload = (0..<(2 * WebSocketBytes.chunkSize + 5)).map { UInt8(truncatingIfNeeded: $0) }
        try channel.writeOutbound(ByteBuffer(bytes: payload))
        var sent: [UInt8] = []
        var sizes: [Int] = []
        while let frame = try channel.readOutbound(as: WebSocketFrame.self) {
            #expect(frame.opcode == .binary && frame.fin && frame.maskKey != nil)
            sizes.append(frame.data.readableBytes)
            sent += frame.data.readableBytesView
        }
        #expect(sent == payload && sizes == [WebSocketBytes.chunkSize, WebSocketBytes.chunkSize, 5])
        // A text frame is not the protocol: a close frame (1003), then the connection closes.
        try channel.writeInbound(WebSocketFrame(fin: true, opcode: .text, data: ByteBuffer(string: "hi")))
        let close = try #require(try channel.readOutbound(as: WebSocketFrame.self))
        var reason = close.data
        #expect(close.opcode == .connectionClose && reason.readWebSocketErrorCode() == .unacceptableData)
        #expect(!channel.isActive)
        #expect(up.messages.count == 3)
    }

    @Test func webSocketBytesAnswerACloseAndServersDoNotMask() throws {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(WebSocketBytes(role: .server))
        try channel.connect(to: .init(ipAddress: "127.0.0.1", port: 1)).wait()
        try channel.writeOutbound(ByteBuffer(bytes: [1]))
        #expect(try channel.readOutbound(as: WebSocketFrame.self)?.maskKey == nil)
        var body = ByteBuffer()
        body.write(webSocketErrorCode: .goingAway)
        try channel.writeInbound(WebSocketFrame(fin: true, opcode: .connectionClose, data: body))
        let reply = try #require(try channel.readOutbound(as: WebSocketFrame.self))
        var code = reply.data
        #expect(reply.opcode == .connectionClose && code.readWebSocketErrorCode() == .goingAway)
        #expect(!channel.isActive)
    }

    /// A peer that pings without reading cannot grow the write queue: while the connection is not writable only the
    /// latest ping is kept, and answered once it is.
    @Test func pingsWhileNotWritableGetOnePongForTheLatest() throws {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(WebSocketBytes(role: .server))
        try channel.connect(to: .init(ipAddress: "127.0.0.1", port: 1)).wait()
        channel.isWritable = false
        for i in 0..<10_000 {
            try channel.writeInbound(WebSocketFrame(fin: true, opcode: .ping, data: ByteBuffer(bytes: [UInt8(i % 256), 1])))
        }
        #expect(try channel.readOutbound(as: WebSocketFrame.self) == nil, "nothing queued while not writable")
        channel.isWritable = true
        channel.pipeline.fireChannelWritabilityChanged()
        let pong = try #require(try channel.readOutbound(as: WebSocketFrame.self))
        #expect(pong.opcode == .pong && Array(pong.data.readableBytesView) == [UInt8(9_999 % 256), 1])
        #expect(try channel.readOutbound(as: WebSocketFrame.self) == nil, "one pong, for the latest ping")
        // Writable again: each ping is answered at once.
        try channel.writeInbound(WebSocketFrame(fin: true, opcode: .ping, data: ByteBuffer(bytes: [7])))
        #expect(try channel.readOutbound(as: WebSocketFrame.self)?.opcode == .pong)
    }
}
