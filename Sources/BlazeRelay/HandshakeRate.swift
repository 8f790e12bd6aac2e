import Synchronization

/// Limits how fast one source address may open connections (each one a handshake to check): a token bucket per
/// address, `rate` per second with bursts of twice that, so a client that reconnects in a loop is refused at once
/// without costing the relay a handshake. Addresses idle for a minute are forgotten, and at most `maxAddresses` are
/// tracked (when full, the oldest half is dropped).
final class HandshakeRate: Sendable {
    private struct Bucket {
        var tokens: Double
        var at: ContinuousClock.Instant
    }

    /// Connections per second per address (0: no limit).
    let rate: Double
    private let burst: Double
    private let buckets = Mutex<[String: Bucket]>([:])
    static let maxAddresses = 100_000

    init(perSecond rate: Int) {
        self.rate = Double(rate)
        self.burst = Double(max(1, 2 * rate))
    }

    /// Takes a token for a connection from `address`; false when it has none left.
    func allow(_ address: String, now: ContinuousClock.Instant = .now) -> Bool {
        guard rate > 0 else { return true }
        return buckets.withLock { b in
            if b.count >= Self.maxAddresses {
                let sorted = b.sorted { $0.value.at < $1.value.at }
                for (key, _) in sorted.prefix(b.count / 2) { b[key] = nil }
            }
            var bucket = b[address] ?? Bucket(tokens: burst, at: now)
            let elapsed = Double((now - bucket.at).components.seconds) + Double((now - bucket.at).components.attoseconds) / 1e18
            bucket.tokens = min(burst, bucket.tokens + elapsed * rate)
            bucket.at = now
            let allowed = bucket.tokens >= 1
            if allowed { bucket.tokens -= 1 }
            b[address] = bucket
            return allowed
        }
    }
}
