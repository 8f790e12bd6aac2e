import Synchronization

/// Bytes that connections together may hold in memory for one purpose (snapshot pieces waiting for their manifest):
/// each reserves what it holds and gives it back once done, so many connections at once cannot hold more than `limit`
/// however they pace themselves.
public final class MemoryBudget: Sendable {
    /// The most bytes reserved at once.
    public let limit: Int
    private let reserved = Mutex(0)

    /// A budget of `limit` bytes, none reserved.
    public init(limit: Int) { self.limit = limit }

    /// Reserves `bytes`; false (nothing reserved) when that would go over the limit.
    public func reserve(_ bytes: Int) -> Bool {
        reserved.withLock { r in
            guard bytes >= 0, bytes <= limit - r else { return false }
            r += bytes
            return true
        }
    }

    /// Gives back `bytes` reserved before.
    public func release(_ bytes: Int) {
        reserved.withLock { $0 = max(0, $0 - bytes) }
    }

    /// Bytes reserved now.
    public var inUse: Int { reserved.withLock { $0 } }
}
