import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// systemd integration without libsystemd: socket activation (`sd_listen_fds`) and readiness (`sd_notify`).
///
/// Both follow the documented environment protocols: `LISTEN_PID`/`LISTEN_FDS` name listening sockets passed from
/// file descriptor 3 on, and `NOTIFY_SOCKET` names a datagram socket (a path, or `@name` in the abstract namespace)
/// that receives newline-separated `KEY=value` assignments.
public enum Systemd {
    /// The first file descriptor systemd passes (`SD_LISTEN_FDS_START`).
    static let firstDescriptor: Int32 = 3

    /// A listening socket systemd handed over.
    public struct InheritedSocket: Sendable, Equatable {
        /// The file descriptor (3).
        public var descriptor: Int32
        /// The filesystem path the socket is bound to.
        public var path: String
    }

    /// The Unix stream socket passed by socket activation, or nil when this process was not socket-activated.
    ///
    /// Accepts exactly one socket, which must be a listening `AF_UNIX` stream socket bound to a path; anything else
    /// is a configuration error. Clears the variables so that child processes do not take the socket for theirs.
    public static func inheritedSocket(environment: [String: String]) throws -> InheritedSocket? {
        guard let pidText = environment["LISTEN_PID"], let countText = environment["LISTEN_FDS"] else { return nil }
        defer {
            for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] { unsetenv(name) }
        }
        guard Int32(pidText) == getpid() else { return nil }  // meant for another process
        guard let count = Int(countText), count >= 1 else {
            throw ListenError(description: "LISTEN_FDS must be a positive number, got \(countText)")
        }
        guard count == 1 else {
            throw ListenError(description: "blazed takes one socket from systemd, got \(count) (LISTEN_FDS)")
        }
        let fd = firstDescriptor
        func option(_ name: Int32) -> Int32? {
            var value: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            return getsockopt(fd, SOL_SOCKET, name, &value, &length) == 0 ? value : nil
        }
        guard option(SO_DOMAIN) == AF_UNIX, option(SO_TYPE) == Int32(SOCK_STREAM.rawValue) else {
            throw ListenError(description: "the socket systemd passed (fd 3) is not a Unix stream socket")
        }
        guard option(SO_ACCEPTCONN) == 1 else {
            throw ListenError(description: "the socket systemd passed (fd 3) is not listening")
        }
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        var address = sockaddr_un()
        var length = socklen_t(MemoryLayout<sockaddr_un>.size)
        let rc = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        let path = rc == 0 ? withUnsafeBytes(of: address.sun_path) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        } : ""
        guard !path.isEmpty else {
            throw ListenError(description: "the socket systemd passed (fd 3) is not bound to a filesystem path")
        }
        return InheritedSocket(descriptor: fd, path: path)
    }

    /// Sends `state` (for example `READY=1`) to the service manager at `socket` (the value of `NOTIFY_SOCKET`).
    /// Returns false when the message could not be sent; a missing manager is not an error for the daemon.
    @discardableResult
    public static func notify(_ state: String, socket path: String?) -> Bool {
        guard let path, !path.isEmpty, path.first == "/" || path.first == "@" else { return false }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(path.utf8)
        if bytes[0] == UInt8(ascii: "@") { bytes[0] = 0 }  // abstract namespace
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard bytes.count < capacity else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + (bytes[0] == 0 ? 0 : 1))
        let fd = Glibc.socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        let message = Array(state.utf8)
        let sent = message.withUnsafeBytes { buffer in
            withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(fd, buffer.baseAddress, buffer.count, Int32(MSG_NOSIGNAL), $0, length)
                }
            }
        }
        return sent == message.count
    }
}
