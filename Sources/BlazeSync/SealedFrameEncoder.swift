import BlazeCrypto
import NIOCore

/// Seals each outgoing message into the next frame of an established sync connection (SYNC.md, "Frames"). A class:
/// `MessageToByteEncoder.encode` is not mutating, and the sealer counts frames.
final class SealedFrameEncoder: MessageToByteEncoder {
    typealias OutboundIn = [UInt8]

    private var sealer: FrameSealer
    private let report: LinkReport

    /// An encoder sealing with `sealer`, counting its bytes on `report`.
    init(sealer: FrameSealer, report: LinkReport) {
        self.sealer = sealer
        self.report = report
    }

    func encode(data: [UInt8], out: inout ByteBuffer) throws {
        let sealed = sealer.seal(data)
        report.unreported.sent += sealed.count
        out.writeBytes(sealed)
    }
}
