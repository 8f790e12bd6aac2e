import BlazeCrypto
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A hostile member that a daemon dials: it listens on loopback and answers the handshake as its server side.
extension HostileMember {
    /// A loopback TCP listener on a free port: its descriptor and the port.
    static func listen() throws -> (fd: Int32, port: Int) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw HostileError("socket: \(String(cString: strerror(errno)))") }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr)
        var size = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, size) }
        }
        guard bound == 0, Glibc.listen(fd, 4) == 0 else {
            Glibc.close(fd)
            throw HostileError("bind/listen: \(String(cString: strerror(errno)))")
        }
        _ = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &size) }
        }
        return (fd, Int(UInt16(bigEndian: addr.sin_port)))
    }

    /// Waits up to `timeoutSeconds` for a connection on `listener`, then answers its handshake as the server with
    /// this member's key; every later read is bounded by `timeoutSeconds` too. Throws when none came or the dialer
    /// failed the handshake.
    func accept(listener: Int32, timeoutSeconds: Int = 10) throws {
        close()
        var poller = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
        guard poll(&poller, 1, Int32(timeoutSeconds * 1000)) == 1 else { throw HostileError("no connection came") }
        let connection = Glibc.accept(listener, nil, nil)
        guard connection >= 0 else { throw HostileError("accept: \(String(cString: strerror(errno)))") }
        var tv = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        fd = connection
        let server = Handshake.Server(identity: identity)
        try writeAll(Self.lengthPrefixed(server.hello))
        let accepted = try server.accept(try readHandshakeFrame(size: Handshake.authSize), spaces: [key])
        try writeAll(Self.lengthPrefixed(accepted.reply))
        cipher = accepted.session
    }
}

/// A hostile member that joins with an invite, as a device does (SYNC.md §9, "Invites").
extension HostileMember {
    /// Connects to the member that issued `invite` (on loopback), sends `JOIN` and reads until the log it is sent
    /// lists this member, or `seconds` pass; returns the operations read.
    func join(_ invite: InviteToken, seconds: Double = 30) throws -> [MembershipOp] {
        guard let port = Int(invite.address.split(separator: ":").last ?? "") else { throw HostileError("no port in the invite") }
        try connect(port: port)
        let me = identity.publicKeys
        try send([6] + invite.id + me.signing + me.agreement + invite.joinProof(device: me))
        var ops: [MembershipOp] = []
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline, MembershipState(space: invite.space, ops: ops).member(identity.nodeID) == nil {
            guard let message = try receive() else { break }
            if message.first == 5 { ops += try MembershipDaemonTests.decodeMembers(message) }
        }
        return ops
    }

    /// A device admitted with the invite `token` through the real path (`JOIN`, then the admin's `add`), as `identity`,
    /// holding every key the log it was sent seals to it; returns it connected (served as a member) with that log,
    /// as sent and resolved.
    static func admitted(
        _ token: String, identity: DeviceIdentity = DeviceIdentity(), seconds: Double = 30
    ) throws -> (member: HostileMember, ops: [MembershipOp], view: MembershipState) {
        let invite = try InviteToken(text: token)
        let m = HostileMember(key: try SpaceKey(id: invite.space, capability: invite.capability), identity: identity)
        let ops = try m.join(invite, seconds: seconds)
        let view = MembershipState(space: invite.space, ops: ops)
        let held = view.keys(for: identity)
        m.key = try SpaceKey(
            id: invite.space, capability: invite.capability, epoch: view.currentEpoch, current: view.currentSecret(held),
            ring: view.ring(held))
        return (m, ops, view)
    }

    /// A `MEMBERS` message (SYNC.md §8) carrying `ops`.
    static func members(_ ops: [MembershipOp]) -> [UInt8] {
        var out: [UInt8] = [5]
        out.appendBE(UInt32(ops.count))
        for op in ops {
            out.appendBE(UInt32(op.bytes.count))
            out += op.bytes
        }
        return out
    }
}
