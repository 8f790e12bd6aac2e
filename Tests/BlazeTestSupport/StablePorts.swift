#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Synchronization

/// Loopback ports for listeners that must get the same port back after a restart.
///
/// A port the kernel picks (`:0`) comes from the ephemeral range, which it also hands out as the local port of every
/// outbound connection: once a killed daemon's listener is gone, another test's connection can take its port before
/// the daemon starts again, and the restart fails with "Address already in use". Ports below that range are never
/// handed out by the kernel, and this process never hands one out twice, so a port taken here stays free for its
/// owner between restarts (barring another program on the machine binding it: callers try another one then).
public enum StablePorts {
    private static let given = Mutex<Set<Int>>([])

    /// Ports the kernel never picks: below its ephemeral range, or above it when that starts low.
    static let outsideEphemeral: Range<Int> = {
        let text = (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)) ?? ""
        let bounds = text.split(whereSeparator: \.isWhitespace).compactMap { Int($0) }
        let (low, high) = bounds.count == 2 ? (bounds[0], bounds[1]) : (32768, 60999)
        return low > 11_000 ? 10_000..<low : min(high + 1, 65_000)..<65_536
    }()

    /// A loopback port no one listens on, outside the ephemeral range, not given out before in this process.
    public static func next() -> Int {
        let range = outsideEphemeral
        for _ in 0..<1_000 {
            let port = Int.random(in: range)
            let fresh = given.withLock { $0.insert(port).inserted }
            if fresh && isFree(port) { return port }
        }
        fatalError("no free loopback port in \(outsideEphemeral)")
    }

    /// True when a TCP listener can bind 127.0.0.1:`port` now.
    static func isFree(_ port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        } == 0
    }
}
