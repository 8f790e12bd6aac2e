// The change feed's stored form: how one applied change is written to its `feed` row (reverse deltas) and read
// back. The feed's types and live side are in ChangeFeed.swift; BlazeDatabase+Feed.swift replays the rows.

import BlazeCRDT
import BlazeProtocol

/// The durable side of the change feed: one `feed` row per applied change, written in the change's transaction.
///
/// Rows hold reverse deltas, `{"d": events}`: an event names its document (`c`, `i`) and says how to get the document
/// *before* the change from the one *after* it, which also gives its type — nothing for an insert, the whole document
/// (`b`) for a delete, and for an update the earlier text of each top-level member the change altered (`u`) and the
/// members it added (`n`), or the whole document before (`w`) when its keys cannot be scanned. The row's origin is
/// "" for the database's home origin (`StampCoding.home`, the node that created it). The document after
/// an event is the current document when no later row touches it, else the "before" of the next event on it: a
/// reader walks back from the current documents, in one read transaction. An update costs the bytes it changed,
/// not a copy of the document, and no row needs the op log, which compaction prunes without looking at the feed.
///
/// Rows written by earlier versions are read as they are: an array of self-contained events (`a` after, `b` before)
/// or `{"e": events, "s": seq}` whose events point into change `s` of the row's origin in the op log
/// (`{"t":"insert","x":k}`: document operation `k` created the document; `{"b":before,"t":"update","x":k}`: the
/// `set`/`unset` patch `k` changed it). Compaction keeps those changes while such rows remain.
enum FeedLog {
    /// A stored event whose documents are not all known yet.
    enum Stored {
        /// Self-contained (rows of earlier versions): both documents are known.
        case complete(FeedEvent)
        /// A reverse delta: the document before follows from the one after, which a later event or the current
        /// document gives.
        case delta(DocKey, FeedEventType, Before)
        /// The change touched the document without a visible change (what it wrote lost to concurrent writes, or
        /// was already there): no event for subscribers, an entry for `doc.history`.
        case touched(DocKey)
    }

    /// How the document before a delta event follows from the one after it.
    enum Before {
        /// It did not exist (an insert).
        case absent
        /// This text (a delete, or an update whose keys could not be scanned).
        case whole(String)
        /// The document after with these members set back (raw earlier values) and these removed.
        case members(set: [String: JSONValue], unset: [String])
    }

    /// A decoded row.
    struct StoredRow {
        let seq: Int64
        let origin: NodeID
        let events: [Stored]
    }

    /// The stored form of `events`, and of the documents in `touched` that the change touched without a visible
    /// change (`{"_":1,"c":…,"i":…}`).
    static func encode(_ events: [FeedEvent], touched: [DocKey] = []) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(events.count * 48 + 16)
        out.append(contentsOf: #"{"d":["#.utf8)
        for (i, key) in touched.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: #"{"_":1,"c":"#.utf8)
            JSONValue.writeString(key.collection, to: &out)
            out.append(contentsOf: #","i":"#.utf8)
            JSONValue.writeString(key.id, to: &out)
            out.append(UInt8(ascii: "}"))
        }
        if !touched.isEmpty && !events.isEmpty { out.append(UInt8(ascii: ",")) }
        for (i, e) in events.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out.append(UInt8(ascii: "{"))
            switch e.type {
            case .insert: break
            case .delete:
                out.append(contentsOf: #""b":"#.utf8)
                out.append(contentsOf: (e.beforeText ?? "null").utf8)
                out.append(UInt8(ascii: ","))
            case .update:
                if !appendDelta(before: e.beforeText ?? "", after: e.afterText ?? "", to: &out) {
                    out.append(contentsOf: #""w":"#.utf8)
                    out.append(contentsOf: (e.beforeText ?? "null").utf8)
                    out.append(UInt8(ascii: ","))
                }
            }
            out.append(contentsOf: #""c":"#.utf8)
            JSONValue.writeString(e.collection, to: &out)
            out.append(contentsOf: #","i":"#.utf8)
            JSONValue.writeString(e.id, to: &out)
            out.append(UInt8(ascii: "}"))
        }
        out.append(contentsOf: "]}".utf8)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends `"n":[…],"u":{…},` — the members `after` added, and the earlier text of those it altered or removed
    /// — when both canonical texts can be scanned (keys in order, none escaped); false (nothing appended) otherwise.
    static func appendDelta(before: String, after: String, to out: inout [UInt8]) -> Bool {
        var (before, after) = (before, after)
        return before.withUTF8 { b in
            after.withUTF8 { a in
                guard let bm = JSONScan.members(b), let am = JSONScan.members(a), sorted(bm), sorted(am) else { return false }
                var added: [String] = []
                var changed: [JSONScan.Member] = []
                var (i, j) = (0, 0)
                while i < bm.count || j < am.count {
                    if j == am.count || (i < bm.count && utf8Less(bm[i].key, am[j].key)) {
                        changed.append(bm[i])  // removed by the change
                        i += 1
                    } else if i == bm.count || utf8Less(am[j].key, bm[i].key) {
                        added.append(am[j].key)
                        j += 1
                    } else {
                        if !b[bm[i].value].elementsEqual(a[am[j].value]) { changed.append(bm[i]) }
                        i += 1
                        j += 1
                    }
                }
                if !added.isEmpty {
                    out.append(contentsOf: #""n":["#.utf8)
                    for (k, key) in added.enumerated() {
                        if k > 0 { out.append(UInt8(ascii: ",")) }
                        JSONValue.writeString(key, to: &out)
                    }
                    out.append(contentsOf: "],".utf8)
                }
                out.append(contentsOf: #""u":{"#.utf8)
                for (k, m) in changed.enumerated() {
                    if k > 0 { out.append(UInt8(ascii: ",")) }
                    JSONValue.writeString(m.key, to: &out)
                    out.append(UInt8(ascii: ":"))
                    out.append(contentsOf: UnsafeBufferPointer(rebasing: b[m.value]))
                }
                out.append(contentsOf: "},".utf8)
                return true
            }
        }
    }

    /// Whether the members' keys are strictly in canonical order.
    private static func sorted(_ members: [JSONScan.Member]) -> Bool {
        zip(members, members.dropFirst()).allSatisfy { utf8Less($0.key, $1.key) }
    }

    /// The document before a delta event of `type`, from the document after it (nil: none); throws `corrupt` when
    /// the two do not fit the type.
    static func before(_ b: Before, type: FeedEventType, after: String?, corrupt: () -> StoreError) throws -> String? {
        switch (type, b) {
        case (.insert, .absent):
            guard after != nil else { throw corrupt() }
            return nil
        case (.delete, .whole(let text)):
            guard after == nil else { throw corrupt() }
            return text
        case (.update, .whole(let text)):
            guard after != nil else { throw corrupt() }
            return text
        case (.update, .members(let set, let unset)):
            guard let after else { throw corrupt() }
            let bytes = Array(after.utf8)
            guard let members = bytes.withUnsafeBufferPointer(JSONScan.members) else { throw corrupt() }
            return String(decoding: JSONScan.splice(bytes, members, set: set, unset: unset), as: UTF8.self)
        default: throw corrupt()
        }
    }

    /// Decodes a stored row; `change` reads change `seq` of the row's origin from the op log (rows of earlier
    /// versions that point into it).
    static func decode(
        seq: Int64, origin: String, events text: String, home: NodeID?, change: (NodeID, UInt64) throws -> Change?
    ) throws -> StoredRow {
        func corrupt() -> StoreError {
            StoreError(.internalFailure, kind: "corrupt_feed", "feed entry \(seq) is corrupt")
        }
        guard let origin = origin.isEmpty ? home : NodeID(hex: origin) else { throw corrupt() }
        let items: [JSONValue]
        var changeSeq: UInt64?
        var deltas = false
        switch try JSONParser(maxDepth: 10_000).parse(text) {
        case .array(let a): items = a
        case .object(let o):
            if case .array(let a)? = o["d"], o.count == 1 {
                items = a
                deltas = true
            } else {
                guard case .array(let a)? = o["e"], case .int(let s)? = o["s"], s > 0 else { throw corrupt() }
                items = a
                changeSeq = UInt64(s)
            }
        default: throw corrupt()
        }
        var ops: [CRDTOp]?
        var events: [Stored] = []
        events.reserveCapacity(items.count)
        for item in items {
            guard case .object(let o) = item else { throw corrupt() }
            if deltas {
                guard case .string(let c)? = o["c"], case .string(let i)? = o["i"], o["t"] == nil else { throw corrupt() }
                if o["_"] != nil {
                    guard o.count == 3 else { throw corrupt() }
                    events.append(.touched(DocKey(collection: c, id: i)))
                    continue
                }
                let before: Before
                let type: FeedEventType
                switch (o["b"], o["w"], o["u"]) {
                case (.object(let doc)?, nil, nil):
                    (type, before) = (.delete, .whole(JSONValue.object(doc).jsonText))
                case (nil, .object(let doc)?, nil):
                    (type, before) = (.update, .whole(JSONValue.object(doc).jsonText))
                case (nil, nil, .object(let u)?):
                    var unset: [String] = []
                    for n in o["n"]?.arrayValue ?? [] {
                        guard case .string(let name) = n else { throw corrupt() }
                        unset.append(name)
                    }
                    (type, before) = (.update, .members(set: u, unset: unset))
                case (nil, nil, nil):
                    guard o["n"] == nil else { throw corrupt() }
                    (type, before) = (.insert, .absent)
                default: throw corrupt()
                }
                events.append(.delta(DocKey(collection: c, id: i), type, before))
                continue
            }
            guard case .string(let t)? = o["t"], let type = FeedEventType(rawValue: t) else { throw corrupt() }
            let before = o["b"]?.objectValue
            if case .int(let k)? = o["x"] {
                if ops == nil {
                    guard let changeSeq, let c = try change(origin, changeSeq) else { throw corrupt() }
                    ops = c.ops
                }
                guard k >= 0, k < ops!.count, case .doc(let op) = ops![Int(k)] else { throw corrupt() }
                var after: [String: JSONValue]
                switch type {
                case .insert:
                    after = op.set
                case .update:
                    guard let before else { throw corrupt() }
                    after = before
                    for (name, value) in op.set { after[name] = value }
                    for name in op.unset { after.removeValue(forKey: name) }
                case .delete: throw corrupt()
                }
                after["_id"] = .string(op.key.id)
                events.append(
                    .complete(
                        FeedEvent(
                            collection: op.key.collection, id: op.key.id, type: type, after: after,
                            afterText: JSONValue.object(after).jsonText, before: before,
                            beforeText: before.map { JSONValue.object($0).jsonText })))
                continue
            }
            guard case .string(let c)? = o["c"], case .string(let i)? = o["i"] else { throw corrupt() }
            let after = o["a"]?.objectValue
            events.append(
                .complete(
                    FeedEvent(
                        collection: c, id: i, type: type, after: after, afterText: after.map { JSONValue.object($0).jsonText },
                        before: before, beforeText: before.map { JSONValue.object($0).jsonText })))
        }
        return StoredRow(seq: seq, origin: origin, events: events)
    }
}
