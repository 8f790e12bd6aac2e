import BlazeCRDT
import BlazeCrypto

/// Consecutive sealed entries of one origin, ending at a head that origin signed: the unit peers exchange.
public struct EntryBatch: Sendable {
    /// The origin of every entry.
    public var origin: NodeID
    /// The entries, in sequence order.
    public var entries: [SealedEntry]
    /// The origin's signature over the last entry.
    public var head: SignedHead

    /// The hash of the batch's entry at `seq`, nil when the batch does not hold it (entries are consecutive).
    public func hash(at seq: UInt64) -> [UInt8]? {
        guard let first = entries.first?.header.seq, seq >= first, seq - first < UInt64(entries.count) else { return nil }
        return entries[Int(seq - first)].hash
    }

    /// Creates a batch.
    public init(origin: NodeID, entries: [SealedEntry], head: SignedHead) {
        self.origin = origin
        self.entries = entries
        self.head = head
    }

    /// The batch's entries after `seq` with the same head (still a valid batch: the head signs the last entry), or nil
    /// when it holds none after `seq`.
    public func after(_ seq: UInt64) -> EntryBatch? {
        guard let first = entries.first?.header.seq, head.seq > seq else { return nil }
        guard seq >= first else { return self }
        let drop = Int(seq - first) + 1
        guard drop < entries.count else { return nil }
        return EntryBatch(origin: origin, entries: Array(entries[drop...]), head: head)
    }

    /// Bytes of its entries.
    public var byteCount: Int { entries.reduce(0) { $0 + $1.bytes.count } }
}
