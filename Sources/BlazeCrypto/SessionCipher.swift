import Crypto
import Foundation

/// Seals and opens the frames of one connection after the handshake: ChaCha20-Poly1305 with a per-direction key and
/// a frame counter as nonce, so a dropped, replayed, reordered or altered frame fails to open.
///
/// A frame is a sealed 4-byte length (20 bytes) followed by the sealed body. The length is authenticated before it is
/// trusted, so a damaged length is refused at once instead of making the receiver wait for bytes that never come.
/// The two directions are independent (`sealer`, `opener`), so a connection's encoder and decoder each own one.
public struct SessionCipher: Sendable {
    /// Seals what this side sends.
    public var sealer: FrameSealer
    /// Opens what this side receives.
    public var opener: FrameOpener

    /// Bytes of a frame's sealed length.
    public static let headerSize = 4 + 16
    /// Bytes a sealed body adds to its plaintext.
    public static let tagSize = 16
    /// Largest message a frame carries: 16 MiB (one batch is at most about 4 MiB of entries, or one entry; a change
    /// larger than this cannot be synced).
    public static let maxMessage = 16 << 20
    /// Largest sealed body accepted: a peer can make the receiver buffer at most this much for one frame.
    public static let maxBody = maxMessage + tagSize

    init(send: SymmetricKey, receive: SymmetricKey) {
        sealer = FrameSealer(key: send)
        opener = FrameOpener(key: receive)
    }

    /// The nonce of frame `counter`'s length (`part` 1) or body (`part` 0).
    static func nonce(_ counter: UInt64, part: UInt8) -> ChaChaPoly.Nonce {
        var bytes: [UInt8] = [part, 0, 0, 0]
        bytes.appendBE(counter)
        return try! ChaChaPoly.Nonce(data: bytes)
    }

    /// Seals the next outgoing frame (see `FrameSealer.seal`).
    public mutating func seal(_ plaintext: [UInt8]) -> [UInt8] { sealer.seal(plaintext) }

    /// Opens the next incoming frame's sealed length (see `FrameOpener.openLength`).
    public func openLength(_ header: ArraySlice<UInt8>) throws(SyncRejection) -> Int { try opener.openLength(header) }

    /// Opens the next incoming frame's sealed body (see `FrameOpener.open`).
    public mutating func open(_ sealed: ArraySlice<UInt8>) throws(SyncRejection) -> [UInt8] { try opener.open(sealed) }

    /// Opens one whole frame (see `FrameOpener.openFrame`).
    public mutating func openFrame(_ frame: ArraySlice<UInt8>) throws(SyncRejection) -> [UInt8] {
        try opener.openFrame(frame)
    }
}

/// The sending half of a session cipher: seals frames under one key, numbering them from 0.
public struct FrameSealer: @unchecked Sendable {
    // @unchecked: SymmetricKey is immutable key material but not marked Sendable on Linux; the counter is a plain value.
    private let key: SymmetricKey
    private var sent: UInt64 = 0

    init(key: SymmetricKey) { self.key = key }

    /// Seals the next outgoing frame: sealed length, then sealed body.
    public mutating func seal(_ plaintext: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(SessionCipher.headerSize + plaintext.count + SessionCipher.tagSize)
        seal(plaintext) { out += $0 }
        return out
    }

    /// Seals the next outgoing frame, handing its parts to `write` in order (the sealed length, its tag, the sealed
    /// body, its tag): a caller writing them into its own buffer copies the body once.
    public mutating func seal(_ plaintext: [UInt8], into write: (Data) -> Void) {
        var length: [UInt8] = []
        length.appendBE(UInt32(plaintext.count + SessionCipher.tagSize))
        let header = try! ChaChaPoly.seal(length, using: key, nonce: SessionCipher.nonce(sent, part: 1))
        let body = try! ChaChaPoly.seal(plaintext, using: key, nonce: SessionCipher.nonce(sent, part: 0))
        sent += 1
        write(header.ciphertext)
        write(header.tag)
        write(body.ciphertext)
        write(body.tag)
    }
}

/// The receiving half of a session cipher: opens frames under one key, expecting them numbered from 0.
public struct FrameOpener: @unchecked Sendable {
    // @unchecked: as `FrameSealer`.
    private let key: SymmetricKey
    private var received: UInt64 = 0

    init(key: SymmetricKey) { self.key = key }

    /// Opens the next incoming frame's sealed length: the number of sealed body bytes that follow.
    public func openLength(_ header: ArraySlice<UInt8>) throws(SyncRejection) -> Int {
        guard header.count == SessionCipher.headerSize,
            let box = try? ChaChaPoly.SealedBox(
                nonce: SessionCipher.nonce(received, part: 1), ciphertext: header.prefix(4), tag: header.suffix(16)),
            let plain = try? ChaChaPoly.open(box, using: key)
        else { throw .badFrame }
        var r = ByteReader(Array(plain)[...])
        guard let length = r.readUInt32(), Int(length) >= SessionCipher.tagSize, Int(length) <= SessionCipher.maxBody
        else { throw .badFrame }
        return Int(length)
    }

    /// Opens the next incoming frame's sealed body (after its length) and moves to the next frame.
    public mutating func open(_ sealed: ArraySlice<UInt8>) throws(SyncRejection) -> [UInt8] {
        guard sealed.count >= SessionCipher.tagSize,
            let box = try? ChaChaPoly.SealedBox(
                nonce: SessionCipher.nonce(received, part: 0), ciphertext: sealed.dropLast(16), tag: sealed.suffix(16)),
            let plain = try? ChaChaPoly.open(box, using: key)
        else { throw .badFrame }
        received += 1
        return Array(plain)
    }

    /// Opens the next incoming frame's sealed body where it lies (in a receive buffer: not copied first), as
    /// `open(_:)`.
    public mutating func open(_ sealed: UnsafeRawBufferPointer) throws(SyncRejection) -> [UInt8] {
        guard sealed.count >= SessionCipher.tagSize,
            let box = try? ChaChaPoly.SealedBox(
                nonce: SessionCipher.nonce(received, part: 0),
                ciphertext: UnsafeRawBufferPointer(rebasing: sealed[..<(sealed.count - 16)]),
                tag: UnsafeRawBufferPointer(rebasing: sealed[(sealed.count - 16)...])),
            let plain = try? ChaChaPoly.open(box, using: key)
        else { throw .badFrame }
        received += 1
        return Array(plain)
    }

    /// Opens one whole frame (sealed length and body), as read from the stream.
    public mutating func openFrame(_ frame: ArraySlice<UInt8>) throws(SyncRejection) -> [UInt8] {
        guard frame.count >= SessionCipher.headerSize else { throw .badFrame }
        let length = try openLength(frame.prefix(SessionCipher.headerSize))
        guard frame.count == SessionCipher.headerSize + length else { throw .badFrame }
        return try open(frame.dropFirst(SessionCipher.headerSize))
    }
}
