import BlazeProtocol

/// A replica's identity: 16 bytes (the first half of SHA-256 of its Ed25519 public key), written as 32 hex digits.
///
/// Held as two big-endian 64-bit halves, so comparing and hashing (done for every stamp) is cheap; ordered by
/// bytes, which is also the order of the hex text. Used as the tie-breaker of equal clocks.
public struct NodeID: Hashable, Comparable, Sendable, CustomStringConvertible {
    let high: UInt64
    let low: UInt64

    /// Parses 32 lowercase hex digits; nil for anything else.
    public init?(hex: String) {
        // Read in place (every stored stamp is parsed with this): no intermediate byte arrays.
        guard hex.utf8.count == 32 else { return nil }
        var halves: (UInt64, UInt64) = (0, 0)
        var i = 0
        for c in hex.utf8 {
            let nibble: UInt8
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): nibble = c &- UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): nibble = c &- UInt8(ascii: "a") &+ 10
            default: return nil
            }
            if i < 16 { halves.0 = halves.0 << 4 | UInt64(nibble) } else { halves.1 = halves.1 << 4 | UInt64(nibble) }
            i += 1
        }
        high = halves.0
        low = halves.1
    }

    /// Builds an id from 16 raw bytes.
    public init(bytes: some Sequence<UInt8>) {
        let b = Array(bytes.prefix(16))
        precondition(b.count == 16, "a node id has 16 bytes")
        high = b[0..<8].reduce(0) { $0 << 8 | UInt64($1) }
        low = b[8..<16].reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// The 16 bytes, big-endian halves in order.
    public var bytes: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(16)
        for half in [high, low] {
            for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: half >> UInt64(shift))) }
        }
        return out
    }

    /// Lowercase hex of the 16 bytes.
    public var hex: String {
        String(unsafeUninitializedCapacity: 32) { out in
            writeHex(into: UnsafeMutableRawBufferPointer(out))
            return 32
        }
    }

    /// Appends the 32 hex digits to `out` (as `hex`, without making a string).
    public func writeHex(to out: inout [UInt8]) {
        let start = out.count
        out.append(contentsOf: repeatElement(0, count: 32))
        out.withUnsafeMutableBytes { writeHex(into: UnsafeMutableRawBufferPointer(rebasing: $0[start...])) }
    }

    private func writeHex(into out: UnsafeMutableRawBufferPointer) {
        for i in 0..<16 {
            let shift = UInt64(60 - 4 * i)
            out[i] = hexDigit(UInt8(truncatingIfNeeded: high >> shift) & 0xF)
            out[16 + i] = hexDigit(UInt8(truncatingIfNeeded: low >> shift) & 0xF)
        }
    }

    /// Orders by bytes.
    public static func < (a: NodeID, b: NodeID) -> Bool { a.high != b.high ? a.high < b.high : a.low < b.low }

    /// The hex text.
    public var description: String { hex }
}

/// A hybrid logical clock value: 48 bits of Unix milliseconds, then a 16-bit counter.
public struct HLC: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The packed value.
    public let raw: UInt64

    /// Wraps a packed value.
    public init(raw: UInt64) { self.raw = raw }

    /// The clock for a wall time, counter 0.
    public init(milliseconds: UInt64) { raw = milliseconds << 16 }

    /// The physical part in Unix milliseconds.
    public var milliseconds: UInt64 { raw >> 16 }

    /// Orders by the packed value.
    public static func < (a: HLC, b: HLC) -> Bool { a.raw < b.raw }

    /// "ms.counter".
    public var description: String { "\(milliseconds).\(raw & 0xFFFF)" }
}

/// The local hybrid logical clock: strictly increasing, never behind wall time, advanced by every remote clock seen.
public struct HybridClock: Sendable {
    /// The last value issued or observed.
    public private(set) var last: HLC
    /// How far ahead of wall time a remote clock may be before it is counted as skewed (it is still accepted).
    public static let maxDriftMilliseconds: UInt64 = 60_000

    /// Starts after `last` (for example the largest clock in the op log).
    public init(last: HLC = HLC(raw: 0)) { self.last = last }

    /// Issues the next clock value for a local event at wall time `now` (milliseconds).
    public mutating func tick(now: UInt64) -> HLC {
        let physical = HLC(milliseconds: now)
        last = physical > last ? physical : HLC(raw: last.raw + 1)
        return last
    }

    /// Advances past a remote clock; returns true when it is further ahead of `now` than `maxDriftMilliseconds`.
    ///
    /// A skewed clock is accepted all the same (convergence comes first); callers log and count it.
    @discardableResult
    public mutating func observe(_ remote: HLC, now: UInt64) -> Bool {
        if remote > last { last = remote }
        return remote.milliseconds > now + Self.maxDriftMilliseconds
    }
}

/// The highest sequence number applied from each origin.
public struct VersionVector: Hashable, Sendable {
    /// Sequence numbers by origin; absent origins are 0.
    public private(set) var entries: [NodeID: UInt64]

    /// Creates a vector.
    public init(_ entries: [NodeID: UInt64] = [:]) { self.entries = entries.filter { $0.value > 0 } }

    /// The sequence for `origin` (0 when none applied).
    public subscript(origin: NodeID) -> UInt64 {
        get { entries[origin] ?? 0 }
        set { entries[origin] = newValue > 0 ? newValue : nil }
    }

    /// True when every entry of `other` is covered by this vector.
    public func includes(_ other: VersionVector) -> Bool {
        other.entries.allSatisfy { self[$0.key] >= $0.value }
    }

    /// JSON object `{originHex: seq}`.
    public var jsonValue: JSONValue {
        .object(Dictionary(uniqueKeysWithValues: entries.map { ($0.key.hex, .int(Int64($0.value))) }))
    }

    /// Appends `jsonValue`'s canonical text to `out` without building it: members ordered by origin, whose
    /// fixed-width lowercase hex sorts as the ids do.
    public func write(to out: inout [UInt8]) {
        out.append(UInt8(ascii: "{"))
        for (i, (origin, seq)) in entries.sorted(by: { $0.key < $1.key }).enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out.append(UInt8(ascii: "\""))
            origin.writeHex(to: &out)
            out.append(contentsOf: "\":".utf8)
            JSONValue.writeInt(Int64(seq), to: &out)
        }
        out.append(UInt8(ascii: "}"))
    }

    /// Reads the JSON form; nil when malformed.
    public init?(json: JSONValue) {
        guard case .object(let o) = json else { return nil }
        var e: [NodeID: UInt64] = [:]
        for (k, v) in o {
            guard let id = NodeID(hex: k), case .int(let s) = v, s >= 0 else { return nil }
            e[id] = UInt64(s)
        }
        self.init(e)
    }
}

/// Identifies one operation: the change it belongs to (origin, seq) and its position in that change.
public struct Dot: Hashable, Sendable {
    /// Author of the change.
    public let origin: NodeID
    /// The change's sequence number for its origin.
    public let seq: UInt64
    /// Position of the operation in the change.
    public let index: Int

    /// Creates a dot.
    public init(origin: NodeID, seq: UInt64, index: Int) {
        self.origin = origin
        self.seq = seq
        self.index = index
    }
}

/// The total order of writes: clock, then origin, then sequence, then position in the change.
public struct Stamp: Hashable, Comparable, Sendable {
    /// The change's clock.
    public let hlc: HLC
    /// Which operation.
    public let dot: Dot

    /// Creates a stamp.
    public init(hlc: HLC, origin: NodeID, seq: UInt64, index: Int) {
        self.hlc = hlc
        dot = Dot(origin: origin, seq: seq, index: index)
    }

    /// Orders by (hlc, origin, seq, index).
    public static func < (a: Stamp, b: Stamp) -> Bool {
        if a.hlc != b.hlc { return a.hlc < b.hlc }
        if a.dot.origin != b.dot.origin { return a.dot.origin < b.dot.origin }
        if a.dot.seq != b.dot.seq { return a.dot.seq < b.dot.seq }
        return a.dot.index < b.dot.index
    }

    /// `[hlc, origin, seq, index]`, the origin as hex.
    public var jsonValue: JSONValue { jsonValue(.hex) }

    /// `[hlc, origin, seq, index]`, the origin as `coding` writes it.
    public func jsonValue(_ coding: StampCoding) -> JSONValue {
        let origin: JSONValue = coding.home == dot.origin ? .int(0) : .string(dot.origin.hex)
        return [.int(Int64(bitPattern: hlc.raw)), origin, .int(Int64(dot.seq)), .int(Int64(dot.index))]
    }

    /// Appends `jsonValue(coding)`'s canonical text to `out` without building it.
    public func write(to out: inout [UInt8], _ coding: StampCoding = .hex) {
        out.append(UInt8(ascii: "["))
        JSONValue.writeInt(Int64(bitPattern: hlc.raw), to: &out)
        if coding.home == dot.origin {
            out.append(contentsOf: ",0,".utf8)
        } else {
            out.append(contentsOf: #",""#.utf8)
            dot.origin.writeHex(to: &out)
            out.append(contentsOf: #"","#.utf8)
        }
        JSONValue.writeInt(Int64(dot.seq), to: &out)
        out.append(UInt8(ascii: ","))
        JSONValue.writeInt(Int64(dot.index), to: &out)
        out.append(UInt8(ascii: "]"))
    }

    /// Reads the JSON form (either origin form); nil when malformed, or when it names the home origin and `coding`
    /// has none.
    public init?(json: JSONValue, _ coding: StampCoding = .hex) {
        guard case .array(let a) = json, a.count == 4, case .int(let h) = a[0], case .int(let s) = a[2],
            case .int(let i) = a[3], h >= 0, s > 0, UInt64(s) < SyncBounds.maxSeq, i >= 0
        else { return nil }
        let origin: NodeID
        switch a[1] {
        case .string(let o):
            guard let id = NodeID(hex: o) else { return nil }
            origin = id
        case .int(0):
            guard let home = coding.home else { return nil }
            origin = home
        default: return nil
        }
        self.init(hlc: HLC(raw: UInt64(bitPattern: h)), origin: origin, seq: UInt64(s), index: Int(i))
    }
}

/// How stored document states write the origins of their stamps.
///
/// A database's states mostly carry stamps of one origin: the node that created the database. That origin, its
/// home, is written as `0` instead of 32 hex digits (about half of a new document's state); other origins are
/// written as hex. The home is fixed when the database is created and kept in its file, so a copy of the file reads
/// the same anywhere. Both forms are always read.
public struct StampCoding: Sendable, Equatable {
    /// The origin written as `0`; nil writes every origin as hex (and reads no `0`).
    public let home: NodeID?

    /// A coding with `home` written as `0`.
    public init(home: NodeID?) { self.home = home }

    /// Every origin as hex.
    public static let hex = StampCoding(home: nil)
}

/// Causal stability (Protocol/SYNC.md §11): which changes every member holds and no change still to come can precede.
public enum Stability {
    /// The stable vector at a replica that applied `applied`, given each current member's latest acknowledgement (the
    /// vector it held, its own entry being what it had authored then; an empty vector for a member not heard from).
    ///
    /// A change is stable once every member's acknowledgement covers it *and* this replica applied everything each
    /// member had authored when it acknowledged: a member's later changes were written after it held the change, so
    /// they are causally after it. Nil while that second condition fails (the caller keeps its last stable vector).
    public static func stableVector(acknowledged: [NodeID: VersionVector], applied: VersionVector) -> VersionVector? {
        guard !acknowledged.isEmpty else { return nil }
        for (member, ack) in acknowledged where applied[member] < ack[member] { return nil }
        var out: [NodeID: UInt64] = [:]
        let origins = Set(acknowledged.values.flatMap { $0.entries.keys })
        for origin in origins {
            let seq = acknowledged.values.map { $0[origin] }.min() ?? 0
            if seq > 0 { out[origin] = min(seq, applied[origin]) }
        }
        return VersionVector(out)
    }
}
