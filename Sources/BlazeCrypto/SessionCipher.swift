import Crypto
import Foundation

/// Seals and opens the frames of one connection after the handshake: ChaCha20-Poly1305 with a per-direction key and
/// a frame counter as nonce, so a dropped, replayed, reordered or altered frame fails to open.
///
/// A frame is a sealed length followed by the sealed body. The length is authenticated before it is trusted, so a
/// damaged length is refused at once instead of making the receiver wait for bytes that never come. Protocol 4's
/// length is the sealed body's (4 bytes, sealed: 20); protocol 5's adds the length of bytes that follow the sealed
/// body in the clear, authenticated by its tag (8 bytes, sealed: 24): what is already sealed under the space's key
/// (a blob chunk) is not encrypted a second time. The two directions are independent (`sealer`, `opener`), so a
/// connection's encoder and decoder each own one.
public struct SessionCipher: Sendable {
    /// Seals what this side sends.
    public var sealer: FrameSealer
    /// Opens what this side receives.
    public var opener: FrameOpener

    /// Bytes of a protocol 4 frame's sealed length.
    public static let headerSize = 4 + 16
    /// Bytes a sealed body adds to its plaintext.
    public static let tagSize = 16
    /// Largest message a frame carries: 16 MiB (one batch is at most about 4 MiB of entries, or one entry; a change
    /// larger than this cannot be synced).
    public static let maxMessage = 16 << 20
    /// Largest sealed body accepted (with the bytes in the clear after it): a peer can make the receiver buffer at
    /// most this much for one frame.
    public static let maxBody = maxMessage + tagSize
    /// The first protocol version whose frames may carry bytes in the clear.
    public static let clearPartsFrom: UInt8 = 5

    /// Bytes of a frame's sealed length in protocol `version`.
    public static func headerSize(_ version: UInt8) -> Int { version >= clearPartsFrom ? 8 + 16 : 4 + 16 }

    init(send: SymmetricKey, receive: SymmetricKey, version: UInt8) {
        sealer = FrameSealer(key: send, version: version)
        opener = FrameOpener(key: receive, version: version)
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

    /// Opens one whole frame (see `FrameOpener.openFrame`).
    public mutating func openFrame(_ frame: ArraySlice<UInt8>) throws(SyncRejection) -> [UInt8] {
        try opener.openFrame(frame)
    }
}

/// How many bytes follow a frame's sealed length: the sealed body (ciphertext and tag), then the bytes sent in the
/// clear that its tag authenticates (none before protocol 5).
public struct FrameBody: Sendable, Equatable {
    /// Bytes of ciphertext and tag.
    public let sealed: Int
    /// Bytes in the clear after them.
    public let clear: Int
    /// Both.
    public var count: Int { sealed + clear }
}

/// The sending half of a session cipher: seals frames under one key, numbering them from 0.
public struct FrameSealer: @unchecked Sendable {
    // @unchecked: SymmetricKey is immutable key material but not marked Sendable on Linux; the counter is a plain value.
    private let key: SymmetricKey
    private var sent: UInt64 = 0
    /// The session's protocol version.
    public let version: UInt8

    init(key: SymmetricKey, version: UInt8) {
        self.key = key
        self.version = version
    }

    /// Bytes a frame adds to what it carries.
    public var overhead: Int { SessionCipher.headerSize(version) + SessionCipher.tagSize }

    /// Seals the next outgoing frame: sealed length, then sealed body.
    public mutating func seal(_ plaintext: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(overhead + plaintext.count)
        seal(plaintext[...]) { out += $0 }
        return out
    }

    /// Seals the next outgoing frame, handing its parts to `write` in order (the sealed length, its tag, the sealed
    /// body, its tag, then `clear`): a caller writing them into its own buffer copies the body once. `clear` (protocol
    /// 5 and later only) follows the sealed body unencrypted, authenticated by the body's tag.
    public mutating func seal(_ plaintext: ArraySlice<UInt8>, clear: ArraySlice<UInt8> = [], into write: (Data) -> Void) {
        precondition(clear.isEmpty || version >= SessionCipher.clearPartsFrom, "clear parts need protocol 5")
        var length: [UInt8] = []
        length.appendBE(UInt32(plaintext.count + SessionCipher.tagSize))
        if version >= SessionCipher.clearPartsFrom { length.appendBE(UInt32(clear.count)) }
        let header = try! ChaChaPoly.seal(length, using: key, nonce: SessionCipher.nonce(sent, part: 1))
        let body = try! ChaChaPoly.seal(plaintext, using: key, nonce: SessionCipher.nonce(sent, part: 0), authenticating: clear)
        sent += 1
        write(header.ciphertext)
        write(header.tag)
        write(body.ciphertext)
        write(body.tag)
        if !clear.isEmpty { clear.withUnsafeBytes { write(Data($0)) } }
    }
}

/// The receiving half of a session cipher: opens frames under one key, expecting them numbered from 0.
public struct FrameOpener: @unchecked Sendable {
    // @unchecked: as `FrameSealer`.
    private let key: SymmetricKey
    private var received: UInt64 = 0
    /// The session's protocol version.
    public let version: UInt8

    init(key: SymmetricKey, version: UInt8) {
        self.key = key
        self.version = version
    }

    /// Bytes of this session's sealed lengths.
    public var headerSize: Int { SessionCipher.headerSize(version) }

    /// Opens the next incoming frame's sealed length: how many bytes of body follow.
    public func openHeader(_ header: ArraySlice<UInt8>) throws(SyncRejection) -> FrameBody {
        guard header.count == headerSize,
            let box = try? ChaChaPoly.SealedBox(
                nonce: SessionCipher.nonce(received, part: 1), ciphertext: header.dropLast(16), tag: header.suffix(16)),
            let plain = try? ChaChaPoly.open(box, using: key)
        else { throw .badFrame }
        var r = ByteReader(Array(plain)[...])
        guard let length = r.readUInt32(), Int(length) >= SessionCipher.tagSize else { throw .badFrame }
        let clear = version >= SessionCipher.clearPartsFrom ? r.readUInt32() : 0
        // Bounds before the sum: each is at most 2^32 - 1, so the sum cannot overflow.
        guard let clear, Int(length) + Int(clear) <= SessionCipher.maxBody else { throw .badFrame }
        return FrameBody(sealed: Int(length), clear: Int(clear))
    }

    /// Opens the next incoming frame's sealed length: the number of body bytes that follow.
    public func openLength(_ header: ArraySlice<UInt8>) throws(SyncRejection) -> Int { try openHeader(header).count }

    /// Opens the next incoming frame's body (after its length) where it lies (in a receive buffer: not copied first),
    /// and moves to the next frame: the plaintext, then the bytes that came in the clear.
    public mutating func open(_ body: UnsafeRawBufferPointer, clear: Int = 0) throws(SyncRejection) -> [UInt8] {
        guard clear >= 0, clear <= body.count, clear == 0 || version >= SessionCipher.clearPartsFrom else { throw .badFrame }
        let sealed = body.count - clear
        guard sealed >= SessionCipher.tagSize else { throw .badFrame }
        let clearPart = UnsafeRawBufferPointer(rebasing: body[sealed...])
        guard
            let box = try? ChaChaPoly.SealedBox(
                nonce: SessionCipher.nonce(received, part: 0),
                ciphertext: UnsafeRawBufferPointer(rebasing: body[..<(sealed - 16)]),
                tag: UnsafeRawBufferPointer(rebasing: body[(sealed - 16)..<sealed])),
            let plain = try? ChaChaPoly.open(box, using: key, authenticating: clearPart)
        else { throw .badFrame }
        received += 1
        guard clear > 0 else { return Array(plain) }
        var out: [UInt8] = []
        out.reserveCapacity(plain.count + clear)
        out += plain
        out += clearPart
        return out
    }

    /// Opens one whole frame (sealed length and body), as read from the stream.
    public mutating func openFrame(_ frame: ArraySlice<UInt8>) throws(SyncRejection) -> [UInt8] {
        guard frame.count >= headerSize else { throw .badFrame }
        let body = try openHeader(frame.prefix(headerSize))
        guard frame.count == headerSize + body.count else { throw .badFrame }
        let bytes = Array(frame.dropFirst(headerSize))
        do {
            return try bytes.withUnsafeBytes { try open($0, clear: body.clear) }
        } catch let rejection as SyncRejection { throw rejection } catch { throw .badFrame }
    }
}
