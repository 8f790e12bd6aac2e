import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Why the daemon refuses to listen at a socket path.
public struct ListenError: Error, CustomStringConvertible, Sendable {
    /// What is wrong and what to do.
    public var description: String
}

/// Creates the daemon's listening Unix socket safely (ARCHITECTURE.md, "Local security").
///
/// The parent directory is created 0700 and must be owned by us and writable by nobody else. A live socket at the path means another daemon
/// runs, so we refuse; a stale socket is replaced; a symlink or anything owned by another user is refused. The
/// socket is made 0600 after `bind` and before `listen`, so no other user can ever connect.
enum SocketListener {
    static func listen(path: String, backlog: Int32 = 256) throws -> Int32 {
        let url = URL(fileURLWithPath: path)
        let dir = url.deletingLastPathComponent().path
        try prepareDirectory(dir)
        try clearStale(path)

        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let pathBytes = Array(path.utf8)
        let capacity = MemoryLayout.size(ofValue: addr.sun_path)
        guard pathBytes.count < capacity else {
            throw ListenError(description: "socket path is \(pathBytes.count) bytes; Unix sockets allow \(capacity - 1)")
        }
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            raw.copyBytes(from: pathBytes)
            raw[pathBytes.count] = 0
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw ListenError(description: "socket(): \(errnoText())") }
        var ok = false
        defer { if !ok { close(fd) } }
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard rc == 0 else { throw ListenError(description: "bind(\(path)): \(errnoText())") }
        guard chmod(path, 0o600) == 0 else { throw ListenError(description: "chmod(\(path)): \(errnoText())") }
        guard Glibc.listen(fd, backlog) == 0 else { throw ListenError(description: "listen(): \(errnoText())") }
        ok = true
        return fd
    }

    static func prepareDirectory(_ dir: String) throws {
        var st = stat()
        if lstat(dir, &st) != 0 {
            try FileManager.default.createDirectory(
                atPath: dir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            guard lstat(dir, &st) == 0 else { throw ListenError(description: "cannot create \(dir): \(errnoText())") }
        }
        guard (st.st_mode & S_IFMT) == S_IFDIR else {
            throw ListenError(description: "\(dir) is not a directory (symlinks are refused)")
        }
        guard st.st_uid == getuid() else {
            throw ListenError(description: "\(dir) is owned by uid \(st.st_uid), not by us (\(getuid())); refusing")
        }
        // Another user who can write the directory could replace the socket between our checks and a client's
        // connect.
        guard st.st_mode & 0o022 == 0 else {
            throw ListenError(
                description: "\(dir) is writable by other users (mode \(String(st.st_mode & 0o7777, radix: 8))); "
                    + "run chmod go-w on it or choose another socket directory")
        }
    }

    static func clearStale(_ path: String) throws {
        var st = stat()
        guard lstat(path, &st) == 0 else { return }
        let type = st.st_mode & S_IFMT
        if type == S_IFLNK {
            throw ListenError(description: "\(path) is a symlink; refusing to start")
        }
        guard type == S_IFSOCK else {
            throw ListenError(description: "\(path) exists and is not a socket; refusing to start")
        }
        guard st.st_uid == getuid() else {
            throw ListenError(description: "\(path) is owned by uid \(st.st_uid); refusing to start")
        }
        if isLive(path) {
            throw ListenError(description: "another daemon is already listening on \(path)")
        }
        unlink(path)
    }

    static func isLive(_ path: String) -> Bool {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        return rc == 0
    }

    static func errnoText() -> String { String(cString: strerror(errno)) }
}
