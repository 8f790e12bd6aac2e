import BlazeProtocol

/// Big-endian writing helpers for the binary sync formats.
extension Array where Element == UInt8 {
    /// Appends `value` as 8 big-endian bytes.
    public mutating func appendBE(_ value: UInt64) {
        for shift in stride(from: 56, through: 0, by: -8) { append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
    }

    /// Appends `value` as an unsigned LEB128 varint (7 bits per byte, low bits first).
    public mutating func appendVarint(_ value: UInt64) {
        var v = value
        while v >= 0x80 {
            append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        append(UInt8(v))
    }

    /// Appends `value` as 4 big-endian bytes.
    public mutating func appendBE(_ value: UInt32) {
        for shift in stride(from: 24, through: 0, by: -8) { append(UInt8(truncatingIfNeeded: value >> UInt32(shift))) }
    }

    /// Appends `epoch` as its 4 big-endian bytes.
    public mutating func appendBE(_ epoch: Epoch) { appendBE(epoch.value) }

    /// Appends `value` as 2 big-endian bytes.
    public mutating func appendBE(_ value: UInt16) {
        append(UInt8(value >> 8))
        append(UInt8(truncatingIfNeeded: value))
    }
}

/// Reads fixed-size fields from a byte slice in order; every read is bounds-checked.
public struct ByteReader {
    private let bytes: ArraySlice<UInt8>
    private var offset: Int

    /// Reads `bytes` from its start.
    public init(_ bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        self.offset = bytes.startIndex
    }

    /// Bytes not read yet.
    public var remaining: Int { bytes.endIndex - offset }

    /// The next `count` bytes, or nil when fewer remain.
    public mutating func read(_ count: Int) -> ArraySlice<UInt8>? {
        guard count >= 0, remaining >= count else { return nil }
        defer { offset += count }
        return bytes[offset..<offset + count]
    }

    /// A big-endian UInt64, or nil when fewer than 8 bytes remain.
    public mutating func readUInt64() -> UInt64? {
        read(8).map { $0.reduce(0) { $0 << 8 | UInt64($1) } }
    }

    /// A big-endian UInt32, or nil when fewer than 4 bytes remain.
    public mutating func readUInt32() -> UInt32? {
        read(4).map { $0.reduce(0) { $0 << 8 | UInt32($1) } }
    }

    /// A big-endian UInt16, or nil when fewer than 2 bytes remain.
    public mutating func readUInt16() -> UInt16? {
        read(2).map { $0.reduce(0) { $0 << 8 | UInt16($1) } }
    }

    /// An unsigned LEB128 varint of at most 10 bytes in its shortest form, or nil when truncated or not canonical.
    public mutating func readVarint() -> UInt64? {
        var value: UInt64 = 0
        for i in 0..<10 {
            guard let byte = readUInt8() else { return nil }
            if i == 9 && byte > 1 { return nil }
            value |= UInt64(byte & 0x7F) << (7 * UInt64(i))
            if byte & 0x80 == 0 { return i > 0 && byte == 0 ? nil : value }
        }
        return nil
    }

    /// The next 16 bytes as a space id, or nil when fewer remain.
    public mutating func readSpaceID() -> SpaceID? { read(SpaceID.size).map { SpaceID(computed: Array($0)) } }

    /// The next 32 bytes as a hash, or nil when fewer remain.
    public mutating func readEntryHash() -> EntryHash? { read(EntryHash.size).map { EntryHash(computed: Array($0)) } }

    /// A big-endian 4-byte epoch, or nil when fewer than 4 bytes remain.
    public mutating func readEpoch() -> Epoch? { readUInt32().map { Epoch($0) } }

    /// A single byte, or nil at the end.
    public mutating func readUInt8() -> UInt8? { read(1)?.first }

    /// Everything not read yet.
    public mutating func rest() -> ArraySlice<UInt8> { read(remaining)! }
}
