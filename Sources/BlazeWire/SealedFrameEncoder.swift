import BlazeCrypto
import BlazeProtocol
import NIOCore

/// Seals each outgoing message into the next frame of an established sync connection (SYNC.md §8, "Framing"). A class:
/// `MessageToByteEncoder.encode` is not mutating, and the sealer counts frames. From protocol 5 a `CHUNK`'s sealed
/// chunk follows its frame's sealed part in the clear, authenticated by the frame's tag: it is sealed under the
/// space's key already. Its type, id and the sealed chunk's header (magic, epoch, nonce) stay in the sealed part
/// (`PeerMessage.chunkSealedPrefix`).
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
        let count = sealer.overhead + data.count
        out.reserveCapacity(minimumWritableBytes: count)
        // Sealed straight into the outgoing buffer: no intermediate copy of the frame.
        let split = sealer.version >= SessionCipher.clearPartsFrom && data.first == PeerMessage.chunkType
            ? min(data.count, PeerMessage.chunkSealedPrefix) : data.count
        sealer.seal(data[..<split], clear: data[split...]) { out.writeBytes($0) }
        counters?.sent(count)
    }
}
