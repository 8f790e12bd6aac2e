import BlazeProtocol

#if canImport(Glibc)
import Glibc
#endif

/// A connection or I/O failure on the client side (not an error response from the daemon).
public struct ClientError: Error, Sendable, CustomStringConvertible {
    /// What went wrong.
    public var description: String

    /// Creates an error.
    public init(_ description: String) { self.description = description }
}

/// A blocking JSON-RPC connection to `blazed` over its Unix socket, for the CLI and tests.
///
/// One request at a time: `call` sends a line and reads lines until the matching response arrives.
/// Not thread-safe; use one connection per thread.
public final class BlazeConnection {
    /// The socket path connected to.
    public let socketPath: String
    private var fd: Int32
    private var buffer: [UInt8] = []
    private var nextID: Int64 = 1

    /// Connects to the daemon; `timeoutSeconds` bounds every read and write (0: no bound).
    public init(socketPath: String, timeoutSeconds: Int = 0) throws(ClientError) {
        self.socketPath = socketPath
        do {
            fd = try Self.connectUnix(socketPath, timeoutSeconds: timeoutSeconds)
        } catch {
            throw error.description.hasPrefix("cannot connect") ? ClientError(error.description + " (is blazed running?)") : error
        }
    }

    /// A blocking stream socket connected to the Unix socket at `path`; `timeoutSeconds` bounds every read and write
    /// (0: no bound). The caller closes it.
    public static func connectUnix(_ path: String, timeoutSeconds: Int = 0) throws(ClientError) -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw ClientError("socket(): \(String(cString: strerror(errno)))") }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: addr.sun_path) else {
            Glibc.close(fd)
            throw ClientError("socket path too long: \(path)")
        }
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        if timeoutSeconds > 0 {
            var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        }
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard rc == 0 else {
            let reason = String(cString: strerror(errno))
            Glibc.close(fd)
            throw ClientError("cannot connect to \(path): \(reason)")
        }
        return fd
    }

    deinit {
        if fd >= 0 { Glibc.close(fd) }
    }

    /// Closes the connection.
    public func close() {
        if fd >= 0 { Glibc.close(fd) }
        fd = -1
    }

    /// Half-closes the connection: the daemon sees end of input, answers what it received, then closes.
    public func shutdownWrite() {
        if fd >= 0 { Glibc.shutdown(fd, Int32(SHUT_WR)) }
    }

    /// Calls a method with its typed parameters and returns its typed result (types generated from the protocol
    /// document); an error response is thrown as `RPCError`, a result of the wrong shape as `ClientError`.
    public func call<P: RPCParameters>(_ params: P) throws -> P.Result {
        let result = try call(P.method.rawValue, params.jsonObject)
        do {
            return try P.decode(result)
        } catch {
            throw ClientError("the result of \(P.method.rawValue) does not match the protocol document: \(error)")
        }
    }

    /// Calls `P`'s method and waits for its success, leaving the result unread: for loops that only need the call
    /// done (benchmarks measuring the daemon, not the decoding).
    public func perform<P: RPCParameters>(_ params: P) throws {
        _ = try call(P.method.rawValue, params.jsonObject)
    }

    /// Calls a method and returns its result; an error response is thrown as `RPCError`.
    public func call(_ method: String, _ params: [String: JSONValue] = [:]) throws -> JSONValue {
        let id = nextID
        nextID += 1
        let request = RPCRequest(id: .int(id), method: method, params: params)
        try send(request.jsonValue.jsonBytes + [0x0A])
        while true {
            let response = try readMessage()
            if response["id"] == nil, response["method"] != nil {
                notifications.append(response)
                continue
            }
            guard response["id"] == .int(id) else { continue }
            if let err = response["error"] {
                throw RPCError(json: err) ?? ClientError("malformed error response: \(err.jsonText)")
            }
            guard let result = response["result"] else {
                throw ClientError("response without result: \(response.jsonText)")
            }
            resultObserver?(method, result)
            return result
        }
    }

    /// Called with the method and result of every successful `call` (test suites check each result against the
    /// method's result schema in `Protocol/blazedb.openrpc.json`).
    public var resultObserver: ((String, JSONValue) -> Void)?

    /// Notifications that arrived while `call` waited for its response, oldest first.
    public var notifications: [JSONValue] = []

    /// The next server notification (e.g. a `subscription` event batch): a queued one, else the next message read.
    /// Responses that arrive meanwhile are skipped.
    public func nextNotification() throws -> JSONValue {
        if !notifications.isEmpty { return notifications.removeFirst() }
        while true {
            let message = try readMessage()
            if message["id"] == nil, message["method"] != nil { return message }
        }
    }

    /// The next notification of kind `N` (others are skipped), read as the protocol document declares it.
    public func nextNotification<N: RPCNotificationParams>(_ type: N.Type) throws -> N {
        while true {
            let message = try nextNotification()
            guard message["method"]?.stringValue == N.method, let params = message["params"] else { continue }
            do {
                return try N(json: params)
            } catch {
                throw ClientError("a \(N.method) notification does not match the protocol document: \(error)")
            }
        }
    }

    /// Writes raw bytes (tests use this to send malformed input).
    public func send(_ bytes: [UInt8]) throws(ClientError) {
        var offset = 0
        while offset < bytes.count {
            // MSG_NOSIGNAL: a daemon that closed the connection is an error to report, not a SIGPIPE that kills us.
            let n = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0 {
                if errno == EINTR { continue }
                throw ClientError("write: \(String(cString: strerror(errno)))")
            }
            offset += n
        }
    }

    /// Reads one line (without `\n`); nil at end of stream.
    public func readLine() throws(ClientError) -> [UInt8]? {
        var searched = 0
        while true {
            if let nl = buffer[searched...].firstIndex(of: 0x0A) {
                let line = Array(buffer[..<nl])
                buffer.removeSubrange(...nl)
                return line
            }
            searched = buffer.count
            var chunk = [UInt8](repeating: 0, count: 65536)
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK { throw ClientError("timed out waiting for the daemon") }
                if errno == ECONNRESET { return nil }
                throw ClientError("read: \(String(cString: strerror(errno)))")
            }
            if n == 0 { return nil }
            buffer.append(contentsOf: chunk[..<n])
        }
    }

    /// Reads and parses one JSON line; throws at end of stream.
    public func readMessage() throws -> JSONValue {
        guard let line = try readLine() else { throw ClientError("the daemon closed the connection") }
        return try JSONParser(maxDepth: 10_000).parse(line)
    }
}
