import NIOCore

/// One inbound frame: a complete line, or the signal that a line exceeded the limit.
enum InboundFrame: Sendable {
    /// A line without its terminating `\n` (and without a trailing `\r`).
    case line(ByteBuffer)
    /// A line grew past the limit; the rest of the input is discarded and the connection must be closed.
    case tooLong
}

/// Splits a byte stream into `\n`-terminated lines, never buffering more than `maxLength` bytes of one line.
struct LineFrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = InboundFrame

    let maxLength: Int
    private var scanned = 0
    private var overflowed = false

    init(maxLength: Int) {
        self.maxLength = maxLength
    }

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        if overflowed {
            buffer.moveReaderIndex(to: buffer.writerIndex)
            return .needMoreData
        }
        let view = buffer.readableBytesView
        let start = view.startIndex + scanned
        if let nl = view[start...].firstIndex(of: UInt8(ascii: "\n")) {
            let length = nl - view.startIndex
            scanned = 0
            if length > maxLength {
                return overflow(context: context, buffer: &buffer)
            }
            var line = buffer.readSlice(length: length)!
            buffer.moveReaderIndex(forwardBy: 1)
            if line.readableBytesView.last == UInt8(ascii: "\r") {
                line = line.getSlice(at: line.readerIndex, length: line.readableBytes - 1)!
            }
            context.fireChannelRead(Self.wrapInboundOut(.line(line)))
            return .continue
        }
        scanned = view.count
        if view.count > maxLength {
            return overflow(context: context, buffer: &buffer)
        }
        return .needMoreData
    }

    private mutating func overflow(context: ChannelHandlerContext, buffer: inout ByteBuffer) -> DecodingState {
        overflowed = true
        scanned = 0
        buffer.moveReaderIndex(to: buffer.writerIndex)
        context.fireChannelRead(Self.wrapInboundOut(.tooLong))
        return .needMoreData
    }

    mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws
        -> DecodingState
    {
        // A final line without a newline is still a request.
        while try decode(context: context, buffer: &buffer) == .continue {}
        if !overflowed, buffer.readableBytes > 0 {
            let line = buffer.readSlice(length: buffer.readableBytes)!
            context.fireChannelRead(Self.wrapInboundOut(.line(line)))
        }
        return .needMoreData
    }
}
