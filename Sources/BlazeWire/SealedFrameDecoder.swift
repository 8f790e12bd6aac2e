import BlazeCrypto
import NIOCore

/// Where a connection's frame codecs count what crossed the wire (a daemon's link status, a relay's counters). Used
/// on the connection's event loop only.
public protocol WireCounters: AnyObject {
    /// Adds the bytes of a frame received.
    func received(_ bytes: Int)
    /// Adds the bytes of a frame sent.
    func sent(_ bytes: Int)
    /// The connection ended inside a frame.
    func lostMidFrame()
}

/// Opens the sealed frames of an established sync connection into message bytes (SYNC.md §8, "Framing").
///
/// A frame's length is sealed and opened before the decoder waits for its body, so damage anywhere in the stream is
/// refused (`SyncRejection.badFrame`) as soon as it arrives, and a peer can make it buffer at most one sealed body
/// (`SessionCipher.maxBody`) beyond the header. Bytes left when the connection ends are reported as a frame lost
/// mid-way.
public struct SealedFrameDecoder: ByteToMessageDecoder {
    public typealias InboundOut = [UInt8]

    private var opener: FrameOpener
    private let counters: (any WireCounters)?
    /// The body of the frame being read, once its header has opened.
    private var body: FrameBody?

    /// A decoder opening frames with `opener`, counting their bytes on `counters`.
    public init(opener: FrameOpener, counters: (any WireCounters)?) {
        self.opener = opener
        self.counters = counters
    }

    public mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        if body == nil {
            guard let header = buffer.readBytes(length: opener.headerSize) else { return .needMoreData }
            body = try opener.openHeader(header[...])
        }
        guard let frame = body, buffer.readableBytes >= frame.count else { return .needMoreData }
        body = nil
        counters?.received(opener.headerSize + frame.count)
        // Opened where it lies in the buffer (no copy of the sealed body first).
        let message = try buffer.readWithUnsafeReadableBytes { raw throws(SyncRejection) -> (Int, [UInt8]) in
            (frame.count, try opener.open(UnsafeRawBufferPointer(rebasing: raw[..<frame.count]), clear: frame.clear))
        }
        // A clear part belongs to a `CHUNK` alone, split where the encoder splits it.
        if frame.clear > 0, message.first != PeerMessage.chunkType || frame.sealed - SessionCipher.tagSize != PeerMessage.chunkSealedPrefix {
            throw SyncRejection.badFrame
        }
        context.fireChannelRead(wrapInboundOut(message))
        return .continue
    }

    public mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws
        -> DecodingState
    {
        if buffer.readableBytes > 0 || body != nil { counters?.lostMidFrame() }
        buffer.moveReaderIndex(to: buffer.writerIndex)
        body = nil
        return .needMoreData
    }
}
