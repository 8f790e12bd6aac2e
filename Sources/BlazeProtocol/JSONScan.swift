/// Finds the top-level members of a JSON object text without parsing their values.
public enum JSONScan {
    /// One member: its key and the byte range of its value's text.
    public struct Member: Sendable {
        /// The key (as written: callers only accept texts whose keys have no escapes).
        public let key: String
        /// Where the value's text lies in the scanned bytes.
        public let value: Range<Int>
    }

    /// The members of the object `bytes` holds, in text order; nil when `bytes` is not a well-formed object at this
    /// level, or when a key contains an escape (its text would then not be the key).
    ///
    /// Values are skipped, not checked: this is for texts the store wrote itself, such as stored documents.
    public static func members(_ bytes: UnsafeBufferPointer<UInt8>) -> [Member]? {
        var i = skipSpace(bytes, 0)
        guard i < bytes.count, bytes[i] == UInt8(ascii: "{") else { return nil }
        i = skipSpace(bytes, i + 1)
        var out: [Member] = []
        out.reserveCapacity(8)
        if i < bytes.count, bytes[i] == UInt8(ascii: "}") { return skipSpace(bytes, i + 1) == bytes.count ? out : nil }
        while i < bytes.count {
            guard bytes[i] == UInt8(ascii: "\"") else { return nil }
            let keyStart = i + 1
            var j = keyStart
            while j < bytes.count, bytes[j] != UInt8(ascii: "\"") {
                if bytes[j] == UInt8(ascii: "\\") { return nil }
                j += 1
            }
            guard j < bytes.count else { return nil }
            let key = String(decoding: UnsafeBufferPointer(rebasing: bytes[keyStart..<j]), as: UTF8.self)
            i = skipSpace(bytes, j + 1)
            guard i < bytes.count, bytes[i] == UInt8(ascii: ":") else { return nil }
            i = skipSpace(bytes, i + 1)
            guard let end = skipValue(bytes, i) else { return nil }
            out.append(Member(key: key, value: i..<end))
            i = skipSpace(bytes, end)
            guard i < bytes.count else { return nil }
            if bytes[i] == UInt8(ascii: "}") { return skipSpace(bytes, i + 1) == bytes.count ? out : nil }
            guard bytes[i] == UInt8(ascii: ",") else { return nil }
            i = skipSpace(bytes, i + 1)
        }
        return nil
    }

    static func skipSpace(_ bytes: UnsafeBufferPointer<UInt8>, _ start: Int) -> Int {
        var i = start
        while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x0A || bytes[i] == 0x0D || bytes[i] == 0x09 { i += 1 }
        return i
    }

    /// The end of the string starting at `start` (its opening quote), after the closing quote.
    static func skipString(_ bytes: UnsafeBufferPointer<UInt8>, _ start: Int) -> Int? {
        var i = start + 1
        while i < bytes.count {
            switch bytes[i] {
            case UInt8(ascii: "\\"): i += 2
            case UInt8(ascii: "\""): return i + 1
            default: i += 1
            }
        }
        return nil
    }

    /// The end of the value starting at `start`.
    static func skipValue(_ bytes: UnsafeBufferPointer<UInt8>, _ start: Int) -> Int? {
        guard start < bytes.count else { return nil }
        switch bytes[start] {
        case UInt8(ascii: "\""):
            return skipString(bytes, start)
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            var depth = 0
            var i = start
            while i < bytes.count {
                switch bytes[i] {
                case UInt8(ascii: "\""):
                    guard let end = skipString(bytes, i) else { return nil }
                    i = end
                    continue
                case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1
                case UInt8(ascii: "}"), UInt8(ascii: "]"):
                    depth -= 1
                    if depth == 0 { return i + 1 }
                default: break
                }
                i += 1
            }
            return nil
        default:
            var i = start
            while i < bytes.count {
                switch bytes[i] {
                case UInt8(ascii: ","), UInt8(ascii: "}"), UInt8(ascii: "]"), 0x20, 0x0A, 0x0D, 0x09: return i > start ? i : nil
                default: i += 1
                }
            }
            return nil
        }
    }

    /// The canonical text of an object after `set` and `unset`, from its canonical text `bytes` and its `members`: the
    /// other members copied as they are (canonical and in key order), the set ones written in their place in key order.
    public static func splice(
        _ bytes: [UInt8], _ members: [JSONScan.Member], set: [String: JSONValue], unset: [String]
    ) -> [UInt8] {
        let added = set.sorted { utf8Less($0.key, $1.key) }
        let removed = Set(unset)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count + 64)
        out.append(UInt8(ascii: "{"))
        func member(_ key: String, _ write: (inout [UInt8]) -> Void) {
            if out.count > 1 { out.append(UInt8(ascii: ",")) }
            JSONValue.writeString(key, to: &out)
            out.append(UInt8(ascii: ":"))
            write(&out)
        }
        var next = 0
        for m in members {
            while next < added.count, utf8Less(added[next].key, m.key) {
                member(added[next].key) { added[next].value.write(to: &$0) }
                next += 1
            }
            if next < added.count, utf8Equal(added[next].key, m.key) {
                member(added[next].key) { added[next].value.write(to: &$0) }
                next += 1
                continue
            }
            if removed.contains(m.key) { continue }
            member(m.key) { $0.append(contentsOf: bytes[m.value]) }
        }
        while next < added.count {
            member(added[next].key) { added[next].value.write(to: &$0) }
            next += 1
        }
        out.append(UInt8(ascii: "}"))
        return out
    }
}
