import BlazeProtocol

/// The payload of an entry of format 3 (SYNC.md §6, "Entry formats"): the change's canonical text with the base64 of
/// each vector value taken out and carried as its bytes, so a 768-d embedding costs 3,072 bytes in the entry instead
/// of 4,096. Opening puts the same text back, byte for byte.
///
/// Layout, big-endian: text length (4) · the text, each `"$vector":"BASE64"` member written `"$vector":""` · count
/// (4, from 0) · count × (length (4, from 1) · bytes), one per emptied member in the order of the text. Packing and
/// unpacking find the same raw sequences (`"$vector":"`, scanning on after each string's closing quote): base64 holds
/// no quote, and emptying a value changes nothing before its closing quote, so `unpack(pack(t)) == t` for every text
/// `pack` takes; and what a packed payload opens to is checked like any change.
public enum VectorPacking {
    private static let member = Array(#""$vector":""#.utf8)
    /// The most bytes one packed value may have (4,096 float32 components, with room for base64's last group).
    static let maxValueBytes = 16 * 1024 + 2

    /// The packed form of `text` (with no value at all when it holds none: in a space that seals format 3 every entry
    /// has that format, so a relay cannot tell which changes hold vectors), or nil when it could not be undone
    /// exactly: a `"$vector"` string that is not canonical base64 of at most `maxValueBytes` bytes, or an empty one
    /// already (neither is a vector a write accepts).
    public static func pack(_ text: some Collection<UInt8>) -> [UInt8]? {
        let text = Array(text)
        var emptied: [UInt8] = []
        var values: [[UInt8]] = []
        var copied = 0
        var i = 0
        let n = member.count
        while let at = find(member, in: text, from: i) {
            let start = at + n
            guard let end = text[start...].firstIndex(of: UInt8(ascii: "\"")), end > start else { return nil }
            let bytes = text.withUnsafeBytes { Base64.decode(UnsafeRawBufferPointer(rebasing: $0[start..<end]), maxBytes: maxValueBytes) }
            guard let bytes else { return nil }
            emptied += text[copied..<start]
            values.append(bytes)
            copied = end
            i = end
        }
        guard text.count < Int(UInt32.max) else { return nil }
        emptied += text[copied...]
        var out: [UInt8] = []
        out.reserveCapacity(emptied.count + 8 + values.reduce(0) { $0 + 4 + $1.count })
        out.appendBE(UInt32(emptied.count))
        out += emptied
        out.appendBE(UInt32(values.count))
        for v in values {
            out.appendBE(UInt32(v.count))
            out += v
        }
        return out
    }

    /// The text `pack` took `packed` from; throws `badPayload` for anything `pack` cannot have written (lengths past
    /// the bytes there, a count that does not match the emptied members, an empty or oversized value, bytes left over).
    /// Every length is checked against what is left before anything is allocated.
    public static func unpack(_ packed: [UInt8]) throws(SyncRejection) -> [UInt8] {
        var r = ByteReader(packed[...])
        guard let textLength = r.readUInt32(), let textBytes = r.read(Int(textLength)), let count = r.readUInt32(),
            Int(count) <= r.remaining / 5
        else { throw .badPayload }
        var values: [ArraySlice<UInt8>] = []
        values.reserveCapacity(Int(count))
        for _ in 0..<count {
            guard let length = r.readUInt32(), length >= 1, Int(length) <= maxValueBytes, let v = r.read(Int(length)) else {
                throw .badPayload
            }
            values.append(v)
        }
        guard r.remaining == 0 else { throw .badPayload }
        let text = Array(textBytes)
        var out: [UInt8] = []
        out.reserveCapacity(text.count + values.reduce(0) { $0 + ($1.count + 2) / 3 * 4 })
        var copied = 0
        var next = 0
        var i = 0
        while let at = find(member, in: text, from: i) {
            let quote = at + member.count
            guard next < values.count, quote < text.count, text[quote] == UInt8(ascii: "\"") else { throw .badPayload }
            out += text[copied..<quote]
            out += Base64.encode(Array(values[values.startIndex + next])).utf8
            next += 1
            copied = quote
            i = quote
        }
        guard next == values.count else { throw .badPayload }
        out += text[copied...]
        return out
    }

    /// The first index at or after `from` where `pattern` starts in `bytes`.
    private static func find(_ pattern: [UInt8], in bytes: [UInt8], from: Int) -> Int? {
        guard pattern.count <= bytes.count else { return nil }
        let last = bytes.count - pattern.count
        var i = from
        let first = pattern[0]
        while i <= last {
            if bytes[i] == first {
                var j = 1
                while j < pattern.count && bytes[i + j] == pattern[j] { j += 1 }
                if j == pattern.count { return i }
            }
            i += 1
        }
        return nil
    }
}
