import NIOCore

/// How handshake messages travel before the session cipher (SYNC.md §8, "Framing"): shared by a daemon's
/// `HandshakeHandler`, the relay's connections and the benchmark's simulated devices.
public enum HandshakeFrame {
    /// A handshake frame: its 4-byte big-endian length, then the message.
    public static func encode(_ body: [UInt8]) -> ByteBuffer {
        var b = ByteBuffer()
        b.reserveCapacity(4 + body.count)
        b.writeInteger(UInt32(body.count))
        b.writeBytes(body)
        return b
    }
}
