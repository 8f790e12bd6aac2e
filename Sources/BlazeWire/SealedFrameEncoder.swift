import BlazeCrypto
import NIOCore

/// Seals each outgoing message into the next frame of an established sync connection (SYNC.md §8, "Framing"). A class:
/// `MessageToByteEncoder.encode` is not mutating, and the sealer counts frames.
public final class SealedFrameEncoder: MessageToByteEncoder {
    public typealias OutboundIn = [UInt8]

    private var sealer: FrameSealer
    private let counters: (any WireCounters)?

    /// An encoder sealing with `sealer`, counting its bytes on `counters`.
    public init(sealer: FrameSealer, counters: (any WireCounters)?) {
        self.sealer = sealer
        self.counters = counters
    }

    public func encode(data: [UInt8], out: inout ByteBuffer) throws {
        let count = SessionCipher.headerSize + data.count + SessionCipher.tagSize
        out.reserveCapacity(minimumWritableBytes: count)
        // Sealed straight into the outgoing buffer: no intermediate copy of the frame.
        sealer.seal(data) { out.writeBytes($0) }
        counters?.sent(count)
    }
}
