import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Synchronization
import Testing

/// What the sync fuzzer generates from its seed: honest chains that must end up on every replica, hostile changes
/// that are well formed and signed but must be refused, forks, and structural damage to any of these.
struct SyncFuzzer {
    var rng: SeededRandom
    let key: SpaceKey
    /// Honest origins: each sends its whole chain so far in every batch (a batch always links to genesis, so a lost
    /// connection never breaks its chain), and a new origin starts when a chain reaches 20 entries.
    private(set) var honest: [(member: HostileMember, entries: [SealedEntry])] = []
    private(set) var counts: [String: Int] = [:]

    /// Throwaway origins for hostile changes and `STATE` heads (every change they sign is refused, so reusing them
    /// costs nothing and saves generating keys for every message).
    private let throwaway: [HostileMember]

    init(seed: UInt64, key: SpaceKey) {
        rng = SeededRandom(seed: seed)
        self.key = key
        throwaway = (0..<32).map { _ in HostileMember(key: key) }
    }

    /// Ids of every document the honest chains wrote.
    var honestIDs: [String] {
        honest.flatMap { chain in chain.entries.indices.map { "ok-\(chain.member.originHex.prefix(12))-\($0 + 1)" } }
    }

    /// The next messages to send, in order, over one connection: one, or both halves of a fork (which must reach
    /// the same replica: two replicas that each stored one branch of a forked origin can never agree on it).
    mutating func next(over member: HostileMember) -> [[UInt8]] {
        let roll = Int.random(in: 0..<100, using: &rng)
        let (kind, messages): (String, [[UInt8]])
        switch roll {
        case 0..<18: (kind, messages) = ("ping", [[HostileMember.pingType]])
        case 18..<36: (kind, messages) = ("state", [state(over: member)])
        case 36..<46: (kind, messages) = ("honest", [honestBatch()])
        case 46..<79: (kind, messages) = ("hostile", [hostileChange()])
        case 79..<82: (kind, messages) = ("acks", [acknowledgements(over: member)])
        case 82..<85: (kind, messages) = ("snapshot", [snapshotMessage(over: member)])
        case 85..<87: (kind, messages) = ("fork", forkPair())
        case 87..<91: (kind, messages) = ("members", [membersMessage(over: member)])
        case 91..<93: (kind, messages) = ("join", [joinMessage()])
        default: (kind, messages) = ("damaged", [damage(anyMessage(over: member))])
        }
        counts[kind, default: 0] += messages.count
        return messages
    }

    /// Every honest chain whole, for the final clean delivery.
    func honestBatches() -> [[UInt8]] {
        honest.filter { !$0.entries.isEmpty }.map { $0.member.message(for: $0.entries) }
    }

    private mutating func anyMessage(over member: HostileMember) -> [UInt8] {
        switch Int.random(in: 0..<6, using: &rng) {
        case 0: return state(over: member)
        case 1: return honestBatch()
        case 2: return forkPair()[0]
        case 3: return acknowledgements(over: member)
        case 4: return snapshotMessage(over: member)
        case 5: return membersMessage(over: member)
        default: return hostileChange()
        }
    }

    /// An `ACKS` message (SYNC.md §11): acknowledgements signed by the connected member or a throwaway one, of this
    /// space or another, naming random origins at any sequence, issued at any time (zero, now, far ahead).
    private mutating func acknowledgements(over member: HostileMember) -> [UInt8] {
        var out: [UInt8] = [7]
        let n = Int.random(in: 0...3, using: &rng)
        out.appendBE(UInt32(n))
        for _ in 0..<n {
            var vector: [[UInt8]: UInt64] = [:]
            for _ in 0..<Int.random(in: 0..<5, using: &rng) {
                let origin = honest.isEmpty || Bool.random(using: &rng)
                    ? (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) }
                    : honest[Int.random(in: 0..<honest.count, using: &rng)].member.origin
                vector[origin] = bigSeq()
            }
            let signer = Bool.random(using: &rng) ? member : throwaway.randomElement(using: &rng)!
            let space = Int.random(in: 0..<5, using: &rng) == 0 ? SpaceID(bytes: (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) })! : key.id
            let issued: UInt64 = [0, UInt64(HostileMember.clockNow()), UInt64.max / 2, UInt64.random(in: 0...UInt64.max, using: &rng)]
                .randomElement(using: &rng)!
            let ack = Acknowledgement(space: space, vector: vector, issuedMs: issued, identity: signer.identity)
            out.appendBE(UInt32(ack.bytes.count))
            out += ack.bytes
        }
        return out
    }

    /// An unrequested snapshot message (`snapshotMessage(signer:key:rng:)`) signed by the connected member.
    private mutating func snapshotMessage(over member: HostileMember) -> [UInt8] {
        Self.snapshotMessage(signer: member.identity, key: key, rng: &rng)
    }

    /// An unrequested `SNAPSHOT_PART` (sealed with `key`, or random bytes) or `SNAPSHOT` manifest (signed by
    /// `signer`, naming pieces and heads that were never sent).
    static func snapshotMessage(signer: DeviceIdentity, key: SpaceKey, rng: inout SeededRandom) -> [UInt8] {
        func random(_ n: Int) -> [UInt8] { (0..<n).map { _ in UInt8.random(in: 0...255, using: &rng) } }
        switch Int.random(in: 0..<3, using: &rng) {
        case 0:
            let part = SnapshotPart.seal(
                random(Int.random(in: 0..<512, using: &rng)), index: UInt32.random(in: 0..<3, using: &rng),
                prev: Bool.random(using: &rng) ? [UInt8](repeating: 0, count: 32) : random(32), key: key)
            return [8] + part.bytes
        case 1:
            return [8] + random(Int.random(in: 0..<128, using: &rng))
        default:
            var heads: [[UInt8]: (seq: UInt64, hash: [UInt8])] = [:]
            for _ in 0..<Int.random(in: 0..<4, using: &rng) { heads[random(16)] = (bigSeq(&rng), random(32)) }
            let manifest = SnapshotManifest(
                space: key.id, createdMs: UInt64(HostileMember.clockNow()), parts: UInt32.random(in: 0..<4, using: &rng),
                size: UInt64.random(in: 0..<(1 << 31), using: &rng), lastPart: random(32), heads: heads, identity: signer)
            return [9] + manifest.bytes
        }
    }

    /// A `MEMBERS` message (SYNC.md §9) of one to three operations signed by the connected member or a throwaway one:
    /// a create of this space (no creator can derive its id), adds, removes and grants naming parents nobody holds or
    /// none, with envelopes to the member under made-up keys, or an operation that is not one. None can take effect.
    private mutating func membersMessage(over member: HostileMember) -> [UInt8] {
        func random(_ n: Int) -> [UInt8] { (0..<n).map { _ in UInt8.random(in: 0...255, using: &rng) } }
        var out: [UInt8] = [5]
        let count = Int.random(in: 1...3, using: &rng)
        out.appendBE(UInt32(count))
        for _ in 0..<count {
            let author = Bool.random(using: &rng) ? member.identity : throwaway[Int.random(in: 0..<throwaway.count, using: &rng)].identity
            let parents = (0..<Int.random(in: 0...2, using: &rng)).map { _ in EntryHash(bytes: random(32))! }
            let time = UInt64(HostileMember.clockNow())
            let action: MembershipOp.Action
            switch Int.random(in: 0..<5, using: &rng) {
            case 0: action = .create(salt: random(16))
            case 1: action = .add(device: throwaway[Int.random(in: 0..<throwaway.count, using: &rng)].identity.publicKeys, role: MemberRole.allCases.randomElement(using: &rng)!)
            case 2: action = .remove(device: random(16), cutoff: bigSeq(), epoch: Epoch(UInt32.random(in: 2...UInt32.max, using: &rng)))
            case 3: action = .grant
            default:
                let junk = random(Int.random(in: 0..<300, using: &rng))
                out.appendBE(UInt32(junk.count))
                out += junk
                continue
            }
            let envelopes = (0..<Int.random(in: 0...2, using: &rng)).compactMap { _ in
                try? KeyEnvelope(
                    sealing: random(32), space: key.id, epoch: Epoch(UInt32.random(in: 1...9, using: &rng)), keyOp: EntryHash(bytes: random(32))!,
                    to: member.identity.publicKeys)
            }
            guard let op = try? MembershipOp(space: key.id, author: author, timeMs: time, parents: parents, action: action, envelopes: envelopes)
            else { continue }
            out.appendBE(UInt32(op.bytes.count))
            out += op.bytes
        }
        return out
    }

    /// A `JOIN` of a throwaway device for an invite nobody issued.
    private mutating func joinMessage() -> [UInt8] {
        Self.joinMessage(joiner: throwaway[Int.random(in: 0..<throwaway.count, using: &rng)].identity.publicKeys, rng: &rng)
    }

    /// A `JOIN` (SYNC.md §9, "Invites") of `joiner` for `invite` (default: one nobody issued), with a proof of either
    /// length made of nothing.
    static func joinMessage(joiner: DevicePublicKeys, invite: [UInt8]? = nil, rng: inout SeededRandom) -> [UInt8] {
        let proof = (0..<(Bool.random(using: &rng) ? 64 : 32)).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let id = invite ?? (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) }
        return [6] + id + joiner.signing + joiner.agreement + proof
    }

    /// `bigSeq(_:)` from this fuzzer's generator.
    private mutating func bigSeq() -> UInt64 { Self.bigSeq(&rng) }

    /// A sequence number near zero, just below `SyncBounds.maxSeq`, or anywhere below it.
    static func bigSeq(_ rng: inout SeededRandom) -> UInt64 {
        switch Int.random(in: 0..<4, using: &rng) {
        case 0: return UInt64.random(in: 0..<50, using: &rng)
        case 1: return SyncBounds.maxSeq - UInt64.random(in: 1..<3, using: &rng)
        default: return UInt64.random(in: 0..<SyncBounds.maxSeq, using: &rng)
        }
    }

    /// A `STATE` naming random origins at sequences within the bound (valid), sometimes with an own head of a
    /// throwaway origin (never an honest one: a head signed over another entry would be fork evidence).
    private mutating func state(over member: HostileMember) -> [UInt8] {
        var vector: [(origin: [UInt8], seq: UInt64)] = []
        for _ in 0..<Int.random(in: 0..<6, using: &rng) {
            let origin: [UInt8] =
                honest.isEmpty || Bool.random(using: &rng)
                ? (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) }
                : honest[Int.random(in: 0..<honest.count, using: &rng)].member.origin
            vector.append((origin, bigSeq()))
        }
        let head: [UInt8]? =
            Int.random(in: 0..<5, using: &rng) == 0
            ? throwaway.randomElement(using: &rng)!.head(
                seq: max(1, bigSeq()), hash: (0..<32).map { _ in UInt8.random(in: 0...255, using: &rng) })
            : nil
        return HostileMember.state(vector, ownHead: head)
    }

    private mutating func honestBatch() -> [UInt8] {
        if honest.isEmpty || honest[honest.count - 1].entries.count >= 20 || Int.random(in: 0..<40, using: &rng) == 0 {
            honest.append((HostileMember(key: key), []))
        }
        let i = Int.random(in: 0..<honest.count, using: &rng)
        var chain = honest[i]
        if chain.entries.count < 20 {
            // Each entry is sealed once (a second sealing of the same seq would be a fork) and resent as it is.
            let seq = chain.entries.count + 1
            let id = "ok-\(chain.member.originHex.prefix(12))-\(seq)"
            let change = chain.member.changeText(
                seq: Int64(seq), hlc: HostileMember.clockNow(), deps: seq > 1 ? [chain.member.originHex: Int64(seq - 1)] : [:],
                ops: [HostileMember.docOp("fuzz", id, set: ["seq": .int(Int64(seq)), "by": .string(chain.member.originHex)])])
            chain.entries.append(
                SealedEntry.seal(
                    change, space: key, origin: chain.member.origin, seq: UInt64(seq),
                    prev: chain.entries.last?.hash ?? SealedEntry.genesis))
            honest[i] = chain
        }
        return chain.member.message(for: chain.entries)
    }

    /// One signed, well-formed entry of a throwaway origin whose change breaks a bound; every such change writes a
    /// document whose id starts with `h-`, and none may ever be stored.
    private mutating func hostileChange() -> [UInt8] {
        let m = throwaway.randomElement(using: &rng)!
        let id = "h-\(m.originHex.prefix(12))"
        let now = HostileMember.clockNow()
        func doc(_ collection: String = "fuzz", _ docID: String? = nil, cl: Int64 = 1, set: [String: JSONValue] = ["x": 1],
            incr: [String: JSONValue]? = nil) -> JSONValue
        {
            HostileMember.docOp(collection, docID ?? id, cl: cl, set: set, incr: incr)
        }
        let payload: [UInt8]
        switch Int.random(in: 0..<16, using: &rng) {
        case 0: payload = m.changeText(seq: 1, hlc: -Int64.random(in: 1...Int64.max, using: &rng), ops: [doc()])
        case 1: payload = m.changeText(seq: 1, hlc: now + (Int64.random(in: 700_000...Int64(1) << 40, using: &rng) << 16), ops: [doc()])
        case 2: payload = m.changeText(seq: 1, hlc: now, ops: [doc(cl: [0, 2, -5, Int64.max, (1 << 48) + 1, (1 << 17) + 1][Int.random(in: 0..<6, using: &rng)])])
        case 3:
            payload = m.changeText(
                seq: 1, hlc: now,
                ops: [doc(), .object(["k": "del", "c": "fuzz", "i": .string(id), "l": .int([1, 3, Int64.max, 1 << 50][Int.random(in: 0..<4, using: &rng)])])])
        case 4: payload = m.changeText(seq: 1, hlc: now, ops: [doc(incr: ["n": ["lots", true, .null, ["a": 1], [1]][Int.random(in: 0..<5, using: &rng)]])])
        case 5: payload = m.changeText(seq: 1, hlc: now, ops: [doc(["", "a b", "_sys", String(repeating: "c", count: 300), "x/../y"][Int.random(in: 0..<5, using: &rng)])])
        case 6: payload = m.changeText(seq: 1, hlc: now, ops: [doc("fuzz", "h-" + String(repeating: "i", count: 600))])
        case 7: payload = m.changeText(seq: 1, hlc: now, ops: [doc(set: [["_x", "", "_id"][Int.random(in: 0..<3, using: &rng)]: 1])])
        case 8: payload = m.changeText(seq: 2, hlc: now, ops: [doc()])
        case 9:
            payload = Array(
                (#"{"o":"\#(String(repeating: "ab", count: 16))","s":1,"h":\#(now),"d":{},"x":[\#(doc().jsonText)]}"#).utf8)
        case 10: payload = Array(["not json", "[1,2]", "{}", String(repeating: "[", count: 200), "{\"o\":1}"][Int.random(in: 0..<5, using: &rng)].utf8)
        case 11: payload = m.changeText(seq: 1, hlc: now, deps: [m.originHex: Int64.max], ops: [doc()])
        case 12:
            payload = m.changeText(
                seq: 1, hlc: now, ops: [.object(["k": "index", "n": .string(["", "a b", String(repeating: "n", count: 300)][Int.random(in: 0..<3, using: &rng)]), "c": "fuzz", "f": ["x"]]), doc()])
        case 13: payload = m.changeText(seq: 1, hlc: now, ops: [.object(["k": "nope", "c": "fuzz", "i": .string(id)]), doc()])
        case 14:
            var nested: JSONValue = 1
            for _ in 0..<80 { nested = .array([nested]) }
            payload = m.changeText(seq: 1, hlc: now, ops: [doc(set: ["deep": nested])])
        default: payload = m.changeText(seq: 1, hlc: now, ops: [doc(cl: 1, set: ["n": 1]), .object(["k": "doc", "c": "fuzz", "i": .string(id), "l": "one"])])
        }
        return m.signedRun([payload]).message
    }

    /// A fork: two different seq-1 entries of one throwaway origin, both signed.
    private mutating func forkPair() -> [[UInt8]] {
        let m = HostileMember(key: key)
        return (0..<2).map { _ in
            let change = m.changeText(
                seq: 1, hlc: HostileMember.clockNow(),
                ops: [HostileMember.docOp("forks", "f-\(m.originHex.prefix(12))-\(UInt32.random(in: 0...UInt32.max, using: &rng))")])
            return m.signedRun([change]).message
        }
    }

    /// `damage(_:rng:)` from this fuzzer's generator.
    private mutating func damage(_ message: [UInt8]) -> [UInt8] { Self.damage(message, rng: &rng) }

    /// Flips, truncates, extends or rewrites parts of a message.
    static func damage(_ message: [UInt8], rng: inout SeededRandom) -> [UInt8] {
        var m = message
        switch Int.random(in: 0..<6, using: &rng) {
        case 0:
            for _ in 0..<Int.random(in: 1...4, using: &rng) where !m.isEmpty {
                m[Int.random(in: 0..<m.count, using: &rng)] ^= UInt8.random(in: 1...255, using: &rng)
            }
        case 1: m = Array(m.prefix(Int.random(in: 0..<max(1, m.count), using: &rng)))
        case 2: m += (0..<Int.random(in: 1...64, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
        case 3: if !m.isEmpty { m[0] = UInt8.random(in: 0...255, using: &rng) }
        case 4:
            // A 4- or 8-byte field somewhere set to an extreme value.
            let width = Bool.random(using: &rng) ? 4 : 8
            if m.count > width {
                let at = Int.random(in: 0...(m.count - width), using: &rng)
                let fill: UInt8 = Bool.random(using: &rng) ? 0xFF : 0x00
                for i in at..<(at + width) { m[i] = fill }
                if fill == 0 { m[at] = 0x80 }
            }
        default:
            // An over-long varint (2^63 or beyond) spliced in.
            let at = Int.random(in: 0...m.count, using: &rng)
            m.insert(contentsOf: [0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01], at: at)
        }
        return m
    }
}
