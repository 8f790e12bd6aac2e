import BlazeCrypto
import BlazeProtocol
import Crypto
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A sync client that holds a space's key and speaks the peer protocol of `Protocol/SYNC.md` (§6–8) from its own
/// reading of that document, but sends whatever a test tells it to: a leaked token or a compromised device.
///
/// It connects over loopback with a blocking socket (every read bounded by a timeout), runs the handshake with
/// `Handshake.Client`, and then seals any bytes as the next frame. It is also an origin of its own (a fresh device
/// identity), so it can author, seal and sign changes that verify, with whatever clocks, sequence numbers and
/// causal lengths a test picks.
final class HostileMember {
    /// The space key: the capability alone while joining, then every key the log seals to this member.
    var key: SpaceKey
    let identity: DeviceIdentity
    /// The member's origin id (16 bytes).
    let origin: [UInt8]
    /// The origin as 32 hex digits.
    let originHex: String
    /// Derived once: `DeviceIdentity.signingKey` rebuilds the key (and its public half) on every use.
    private let signingKey: Curve25519.Signing.PrivateKey
    private let publicKey: [UInt8]
    var fd: Int32 = -1
    var cipher: SessionCipher?

    /// Message type bytes (SYNC.md §8).
    static let stateType: UInt8 = 1, entriesType: UInt8 = 2, errorType: UInt8 = 3, pingType: UInt8 = 4

    init(key: SpaceKey, identity: DeviceIdentity = DeviceIdentity()) {
        self.key = key
        self.identity = identity
        signingKey = identity.signingKey
        publicKey = Array(signingKey.publicKey.rawRepresentation)
        origin = Array(SHA256.hash(data: publicKey).prefix(16))
        originHex = hexString(origin)
    }

    deinit { close() }

    // MARK: Connection

    /// Connects to `127.0.0.1:port` and completes the handshake; throws when the server refuses it. With `webSocket`
    /// (an HTTP path), the connection is first upgraded to a WebSocket (RFC 6455, as a relay is reached), its request
    /// carrying `headers` ("Name: value") besides, and every byte afterwards travels in masked binary frames. With
    /// `handshake` false it stops once the server's hello came: a connection admitted that stalls in its handshake.
    func connect(
        port: Int, timeoutSeconds: Int = 10, webSocket path: String? = nil, headers: [String] = [], handshake: Bool = true
    ) throws {
        close()
        fd = try Self.openSocket(port: port, timeoutSeconds: timeoutSeconds)
        if let path { try upgrade(port: port, path: path, headers: headers) }
        var client = Handshake.Client(key: key, identity: identity)
        let hello = try readHandshakeFrame(size: Handshake.helloSize)
        guard handshake else { return }
        try writeAll(Self.lengthPrefixed(try client.respond(to: hello)))
        let reply = try readHandshakeFrame(size: Handshake.replySize)
        cipher = try client.finish(reply).session
    }

    /// A TCP connection to `127.0.0.1:port` with send and receive timeouts; nothing is sent.
    static func openSocket(port: Int, timeoutSeconds: Int = 10, sourceAddress: String? = nil) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw HostileError("socket: \(String(cString: strerror(errno)))") }
        var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        if let sourceAddress {
            var local = sockaddr_in()
            local.sin_family = sa_family_t(AF_INET)
            inet_pton(AF_INET, sourceAddress, &local.sin_addr)
            let bound = withUnsafePointer(to: &local) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard bound == 0 else {
                Glibc.close(fd)
                throw HostileError("bind \(sourceAddress): \(String(cString: strerror(errno)))")
            }
        }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr)
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else {
            Glibc.close(fd)
            throw HostileError("connect: \(String(cString: strerror(errno)))")
        }
        return fd
    }

    func close() {
        if let drained {
            // Wake the draining thread and let it finish before the descriptor can be reused.
            shutdown(fd, Int32(SHUT_RDWR))
            _ = drained.wait(timeout: .now() + 30)
        }
        if fd >= 0 { Glibc.close(fd) }
        fd = -1
        cipher = nil
        drained = nil
        framed = false
        inbound = []
    }

    /// Signalled when the draining thread has stopped reading.
    private var drained: DispatchSemaphore?

    /// Reads and discards everything the server sends from now on, on a thread of its own, so the server never
    /// blocks writing to this member; the thread stops at EOF or at `close()`. `receive` is not used afterwards.
    func startDraining() {
        guard fd >= 0, drained == nil else { return }
        let done = DispatchSemaphore(value: 0)
        drained = done
        let fd = self.fd
        Thread {
            defer { done.signal() }
            var buffer = [UInt8](repeating: 0, count: 65_536)
            while true {
                let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
                // A receive timeout is not the end: only EOF or an error (after `close()`'s shutdown) is.
                if n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR)) { continue }
                break
            }
        }.start()
    }

    /// Seals `message` as the next frame and sends it.
    func send(_ message: [UInt8]) throws {
        guard var c = cipher else { throw HostileError("not connected") }
        let sealed = c.seal(message)
        cipher = c
        try writeAll(sealed)
    }

    /// The next message from the server, nil when the connection closed (or nothing came within the timeout).
    func receive() throws -> [UInt8]? {
        guard var c = cipher else { throw HostileError("not connected") }
        guard let header = try? readExactly(c.opener.headerSize) else { return nil }
        let length = try c.openLength(header[...])
        guard let body = try? readExactly(length) else { return nil }
        let plain = try c.openFrame((header + body)[...])
        cipher = c
        return plain
    }

    /// Reads messages until the server closes the connection (true) or `seconds` pass (false); returns the
    /// `ERROR` reason if one came.
    func awaitClose(seconds: Double = 10) -> (closed: Bool, error: String?) {
        let deadline = Date().addingTimeInterval(seconds)
        var reason: String?
        while Date() < deadline {
            guard let message = try? receive() else { return (true, reason) }
            if message.first == Self.errorType { reason = String(decoding: message.dropFirst(), as: UTF8.self) }
        }
        return (false, reason)
    }

    func readHandshakeFrame(size: Int) throws -> [UInt8] {
        let length = try readExactly(4)
        let n = Int(length[0]) << 24 | Int(length[1]) << 16 | Int(length[2]) << 8 | Int(length[3])
        guard n == size else { throw HostileError("handshake frame of \(n) bytes, expected \(size)") }
        return try readExactly(size)
    }

    // MARK: WebSocket (RFC 6455)

    /// Whether the connection carries WebSocket frames, and the payload bytes read and not yet consumed.
    private var framed = false
    private var inbound: [UInt8] = []

    /// Sends the upgrade request and checks the `101` answer and its `Sec-WebSocket-Accept`.
    private func upgrade(port: Int, path: String, headers: [String]) throws {
        let key = Data((0..<16).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()
        let request =
            "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: 13\r\n" + headers.map { $0 + "\r\n" }.joined() + "\r\n"
        try writeRaw(Array(request.utf8))
        var head: [UInt8] = []
        while !head.suffix(4).elementsEqual([13, 10, 13, 10]) {
            guard head.count < 8192 else { throw HostileError("upgrade response too long") }
            head += try readRaw(1)
        }
        let text = String(decoding: head, as: UTF8.self)
        guard text.hasPrefix("HTTP/1.1 101") else { throw HostileError("upgrade refused: \(text.prefix(40))") }
        let accept = Data(Insecure.SHA1.hash(data: Data((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").utf8))).base64EncodedString()
        guard text.lowercased().contains("sec-websocket-accept: \(accept.lowercased())") else {
            throw HostileError("upgrade answered without the right Sec-WebSocket-Accept")
        }
        framed = true
    }

    /// Reads frames until `n` payload bytes are there (answering pings), then takes them.
    private func readExactly(_ n: Int) throws -> [UInt8] {
        guard framed else { return try readRaw(n) }
        while inbound.count < n {
            let h = try readRaw(2)
            var length = Int(h[1] & 0x7F)
            if length == 126 {
                let b = try readRaw(2)
                length = Int(b[0]) << 8 | Int(b[1])
            } else if length == 127 {
                length = try readRaw(8).reduce(0) { $0 << 8 | Int($1) }
            }
            guard h[1] & 0x80 == 0 else { throw HostileError("a server frame was masked") }
            guard length <= 1 << 24 else { throw HostileError("frame of \(length) bytes") }
            let payload = try readRaw(length)
            switch h[0] & 0x0F {
            case 0, 2: inbound += payload
            case 8: throw HostileError("closed")
            case 9: try writeFrame(opcode: 0xA, payload)
            default: break
            }
        }
        defer { inbound.removeFirst(n) }
        return Array(inbound.prefix(n))
    }

    /// Sends `payload` as one masked frame with `opcode`.
    func writeFrame(opcode: UInt8, _ payload: [UInt8]) throws {
        var frame: [UInt8] = [0x80 | opcode]
        if payload.count < 126 {
            frame.append(0x80 | UInt8(payload.count))
        } else if payload.count <= 0xFFFF {
            frame += [0x80 | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
        } else {
            frame.append(0x80 | 127)
            frame.appendBE(UInt64(payload.count))
        }
        let mask = (0..<4).map { _ in UInt8.random(in: 0...255) }
        frame += mask
        frame += payload.enumerated().map { $0.element ^ mask[$0.offset & 3] }
        try writeRaw(frame)
    }

    private func readRaw(_ n: Int) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: n)
        var got = 0
        while got < n {
            let r = out.withUnsafeMutableBytes { recv(fd, $0.baseAddress! + got, n - got, 0) }
            guard r > 0 else { throw HostileError(r == 0 ? "closed" : "recv: \(String(cString: strerror(errno)))") }
            got += r
        }
        return out
    }

    /// Sends `bytes` (in one binary frame over a WebSocket).
    func writeAll(_ bytes: [UInt8]) throws {
        if framed { try writeFrame(opcode: 2, bytes) } else { try writeRaw(bytes) }
    }

    private func writeRaw(_ bytes: [UInt8]) throws {
        var sent = 0
        while sent < bytes.count {
            let r = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + sent, bytes.count - sent, Int32(MSG_NOSIGNAL)) }
            guard r > 0 else { throw HostileError("send: \(String(cString: strerror(errno)))") }
            sent += r
        }
    }

    static func lengthPrefixed(_ body: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.appendBE(UInt32(body.count))
        return out + body
    }

    // MARK: Messages (SYNC.md §8)

    /// Decodes a `STATE` message's vector (nil for any other message).
    static func vector(ofState message: [UInt8]) -> [(origin: [UInt8], seq: UInt64)]? {
        guard message.first == stateType, message.count >= 5 else { return nil }
        let n = Int(message[1]) << 24 | Int(message[2]) << 16 | Int(message[3]) << 8 | Int(message[4])
        guard message.count >= 5 + n * 24 else { return nil }
        return (0..<n).map { i in
            let at = 5 + i * 24
            let seq = message[(at + 16)..<(at + 24)].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
            return (Array(message[at..<(at + 16)]), seq)
        }
    }

    /// `STATE`: `count (4) · count × (origin (16) · seq (8))`, then optionally a head (152).
    static func state(_ vector: [(origin: [UInt8], seq: UInt64)], ownHead: [UInt8]? = nil) -> [UInt8] {
        var out: [UInt8] = [stateType]
        out.appendBE(UInt32(vector.count))
        for (origin, seq) in vector {
            out += origin
            out.appendBE(seq)
        }
        return out + (ownHead ?? [])
    }

    /// `ENTRIES`: `head (152) · count (4) · packed run`.
    static func entries(head: [UInt8], count: UInt32, run: [UInt8]) -> [UInt8] {
        var out: [UInt8] = [entriesType]
        out += head
        out.appendBE(count)
        return out + run
    }

    /// The start of a packed run of this origin's entries (SYNC.md §6): space, origin, first seq, first `prev`.
    func runPrefix(firstSeq: UInt64, prev: [UInt8] = SealedEntry.genesis) -> [UInt8] {
        var out = key.id.bytes + origin
        out.appendBE(firstSeq)
        return out + prev
    }

    /// A head of this member's origin at `seq` over `hash`, signed for the space (valid or not for any entry).
    func head(seq: UInt64, hash: [UInt8]) -> [UInt8] {
        var message = Array("blazedb head v1".utf8) + key.id.bytes + origin
        message.appendBE(seq)
        message += hash
        var out = origin
        out.appendBE(seq)
        out += hash
        out += publicKey
        out += Array(try! signingKey.signature(for: message))
        return out
    }

    // MARK: Authoring

    /// The JSON text of a change of this member's origin.
    func changeText(seq: Int64, hlc: Int64, deps: [String: Int64] = [:], ops: [JSONValue]) -> [UInt8] {
        let change: JSONValue = [
            "o": .string(originHex), "s": .int(seq), "h": .int(hlc),
            "d": .object(deps.mapValues { .int($0) }), "x": .array(ops),
        ]
        return Array(change.jsonText.utf8)
    }

    /// A doc op (`k: doc`) setting `set` at causal length `cl`.
    static func docOp(_ collection: String, _ id: String, cl: Int64 = 1, set: [String: JSONValue] = [:],
        incr: [String: JSONValue]? = nil) -> JSONValue
    {
        var o: [String: JSONValue] = ["k": "doc", "c": .string(collection), "i": .string(id), "l": .int(cl)]
        if !set.isEmpty { o["set"] = .object(set) }
        if let incr { o["incr"] = .object(incr) }
        return .object(o)
    }

    /// The `ENTRIES` message carrying `entries` (this origin's, consecutive and linked) with a head signed over the
    /// last one.
    func message(for entries: [SealedEntry]) -> [UInt8] {
        var run: [UInt8] = []
        try! EntryRun.pack(entries, into: &run)
        let last = entries.last!
        return Self.entries(head: head(seq: last.header.seq, hash: last.hash), count: UInt32(entries.count), run: run)
    }

    /// Seals `payloads` as this origin's entries from `firstSeq` (linked to `prev`), and the `ENTRIES` message that
    /// carries them with a head signed over the last one.
    func signedRun(_ payloads: [[UInt8]], firstSeq: UInt64 = 1, prev: [UInt8] = SealedEntry.genesis)
        -> (entries: [SealedEntry], message: [UInt8])
    {
        var entries: [SealedEntry] = []
        var link = prev
        for (i, payload) in payloads.enumerated() {
            let e = SealedEntry.seal(payload, space: key, origin: origin, seq: firstSeq + UInt64(i), prev: link)
            entries.append(e)
            link = e.hash
        }
        return (entries, message(for: entries))
    }

    /// Wall-clock time as a hybrid clock value (milliseconds << 16).
    static func clockNow(plusMilliseconds: Int64 = 0) -> Int64 {
        (Int64(Date().timeIntervalSince1970 * 1000) + plusMilliseconds) << 16
    }
}

struct HostileError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
