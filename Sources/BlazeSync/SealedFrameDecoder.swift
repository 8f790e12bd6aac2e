import BlazeCrypto
import NIOCore

/// Opens the sealed frames of an established sync connection into message bytes (SYNC.md, "Frames").
///
/// A frame's length is sealed and opened before the decoder waits for its body, so damage anywhere in the stream is
/// refused (`SyncRejection.badFrame`) as soon as it arrives, and a peer can make it buffer at most one sealed body
/// (`SessionCipher.maxBody`) beyond the header. Bytes left when the connection ends are reported as a frame lost
/// mid-way.
struct SealedFrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = [UInt8]

    private var opener: FrameOpener
    private let report: LinkReport
    /// The sealed body length of the frame being read, once its header has opened.
    private var bodyLength: Int?

    /// A decoder opening frames with `opener`, counting their bytes on `report`.
    init(opener: FrameOpener, report: LinkReport) {
        self.opener = opener
        self.report = report
    }

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        if bodyLength == nil {
            guard let header = buffer.readBytes(length: SessionCipher.headerSize) else { return .needMoreData }
            bodyLength = try opener.openLength(header[...])
        }
        guard let length = bodyLength, let body = buffer.readBytes(length: length) else { return .needMoreData }
        bodyLength = nil
        report.unreported.received += SessionCipher.headerSize + length
        context.fireChannelRead(wrapInboundOut(try opener.open(body[...])))
        return .continue
    }

    mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws
        -> DecodingState
    {
        if buffer.readableBytes > 0 || bodyLength != nil {
            report.update { $0.errors += 1; $0.lastError = "connection lost mid-frame" }
        }
        buffer.moveReaderIndex(to: buffer.writerIndex)
        bodyLength = nil
        return .needMoreData
    }
}
