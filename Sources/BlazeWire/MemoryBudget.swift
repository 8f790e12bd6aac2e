import Synchronization

/// Bytes that connections together may hold in memory for one purpose (snapshot pieces waiting for their manifests):
/// each reserves what it holds and gives it back once done, so many connections at once cannot hold more than `limit`
/// however they pace themselves — nor those of one key (a space) more than `perKey`.
public final class MemoryBudget: Sendable {
    /// The most bytes reserved at once, and the most for one key.
    public let limit: Int, perKey: Int
    private let reserved = Mutex<(total: Int, byKey: [String: Int])>((0, [:]))

    /// A budget of `limit` bytes, at most `perKey` of them for one key, none reserved.
    public init(limit: Int, perKey: Int? = nil) {
        self.limit = limit
        self.perKey = perKey ?? limit
    }

    /// Reserves `bytes` (for `key`); false (nothing reserved) when that would go over a limit.
    public func reserve(_ bytes: Int, for key: String = "") -> Bool {
        reserved.withLock { r in
            let held = r.byKey[key, default: 0]
            guard bytes >= 0, bytes <= limit - r.total, bytes <= perKey - held else { return false }
            r.total += bytes
            r.byKey[key] = held + bytes
            return true
        }
    }

    /// Gives back `bytes` reserved before (for `key`).
    public func release(_ bytes: Int, for key: String = "") {
        reserved.withLock { r in
            let given = min(max(0, bytes), r.byKey[key, default: 0])
            r.total -= given
            let left = r.byKey[key, default: 0] - given
            r.byKey[key] = left > 0 ? left : nil
        }
    }

    /// Bytes reserved now.
    public var inUse: Int { reserved.withLock { $0.total } }
}
