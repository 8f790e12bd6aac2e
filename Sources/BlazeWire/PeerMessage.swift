import BlazeCRDT
import BlazeCrypto
import BlazeProtocol

/// The messages peers exchange after the handshake (SYNC.md §8), each sealed in one frame.
public enum PeerMessage: Sendable {
    /// What the sender holds per origin, and the sender's own latest signed head (if it has any entries).
    case state(vector: [NodeID: UInt64], ownHead: SignedHead?)
    /// Consecutive entries of one origin ending at its signed head.
    case entries(EntryBatch)
    /// Why the sender is about to close the connection.
    case error(String)
    /// Nothing: keeps a quiet connection's silence timer from expiring.
    case ping
    /// Membership operations the receiver may lack (SYNC.md §9), each verified when decoded.
    case members([MembershipOp])
    /// A joining device redeems an invite: its id, the joiner's device keys, and the proof that it holds the invite's
    /// secret, bound to those keys (`InviteToken.joinProof`). A relay passes it on to the space's members.
    case join(id: [UInt8], device: DevicePublicKeys, proof: [UInt8])
    /// Members' signed statements of what they hold (SYNC.md §11), the sender's own and those it passes on.
    case acks([Acknowledgement])
    /// One sealed piece of a state snapshot (SYNC.md §11), in order; the manifest follows the last.
    case snapshotPart(SnapshotPart)
    /// The signed manifest that ends a snapshot: the receiver verifies the pieces against it and installs it.
    case snapshot(SnapshotManifest)
    /// The member that issued an invite refuses a join passed on by a relay (`InviteRefusal`): the invite id, the
    /// joiner's Ed25519 key and why. A relay passes it to the joiner's connection only.
    case joinRefused(id: [UInt8], device: [UInt8], reason: InviteRefusal)
    /// Blob chunks the sender lacks and asks the receiver for, at most `maxChunkWants` ids; a relay's answer to a
    /// `CHUNK_OFFER` names those of the offer it takes, possibly none.
    case chunkWant([ChunkID])
    /// One chunk the receiver asked for, sealed under an epoch key of the space (`SealedChunk`): the receiver opens it
    /// and checks its content against the id. Decoded, `sealed` is a slice of the message (a chunk is not copied).
    case chunk(id: ChunkID, sealed: ArraySlice<UInt8>)
    /// Chunks the receiver asked for that the sender does not hold.
    case chunkMissing([ChunkID])
    /// Chunks a device holds and offers a relay, 1 to `maxChunkWants` ids; the relay answers with one `CHUNK_WANT`.
    case chunkOffer([ChunkID])
    /// Chunks a relay served that did not open as their ids: the relay drops its copies (a member's next offer
    /// restores them).
    case chunkBad([ChunkID])
    /// Chunks a device still needs a relay to keep, 1 to `maxChunkKeep` ids: the relay renews the lease of those it
    /// holds (Protocol/RELAY.md, "Blob chunks"), and answers nothing.
    case chunkKeep([ChunkID])
    /// The sender's wall clock (Unix ms) as it sent this, once at the start of a protocol 5 session: the receiver
    /// reports how far the clocks differ (`clockSkewMs`), which `blazectl doctor` checks.
    case clock(ms: UInt64)
    /// Members' signed statements of the entry formats they open (SYNC.md §6, "Entry formats"), 1 to
    /// `maxStatements`, sent only on protocol 6 or later; decoded unverified (`FormatStatement.isSigned`).
    case formats([FormatStatement])

    static let stateType: UInt8 = 1
    static let entriesType: UInt8 = 2
    static let errorType: UInt8 = 3
    static let pingType: UInt8 = 4
    static let membersType: UInt8 = 5
    static let joinType: UInt8 = 6
    static let acksType: UInt8 = 7
    static let snapshotPartType: UInt8 = 8
    static let snapshotType: UInt8 = 9
    static let joinRefusedType: UInt8 = 10
    static let chunkWantType: UInt8 = 11
    static let chunkType: UInt8 = 12
    static let chunkMissingType: UInt8 = 13
    static let chunkOfferType: UInt8 = 14
    static let chunkBadType: UInt8 = 15
    static let chunkKeepType: UInt8 = 16
    static let clockType: UInt8 = 17
    static let formatsType: UInt8 = 18
    /// The most statements one `FORMATS` carries (a space's members beyond it go in further messages).
    public static let maxStatements = 1024
    /// The bytes an encoded `CHUNK` of chunk `id` starts with; its sealed chunk follows them (a sender may seal a
    /// chunk straight after them instead of encoding `.chunk`).
    public static func chunkHeader(_ id: ChunkID) -> [UInt8] { [chunkType] + id.bytes }
    /// Bytes of a `CHUNK` a protocol 5 frame seals (type, id and the sealed chunk's header: its epoch and nonce are not
    /// shown to onlookers); the rest, ciphertext and tag under the space's key, is the frame's clear part.
    public static let chunkSealedPrefix = 1 + ChunkID.count + SealedChunkLayout.headerCount

    /// The most chunk ids one `CHUNK_WANT`, `CHUNK_MISSING`, `CHUNK_OFFER` or `CHUNK_BAD` names.
    public static let maxChunkWants = 64
    /// The most chunk ids a device offers a relay at once: a relay takes at most this many of one offer, so one
    /// connection holds at most 64 MiB of the relay's room for uploads.
    public static let maxChunkOffer = 16
    /// The most chunk ids one `CHUNK_KEEP` names (32 KiB of ids).
    public static let maxChunkKeep = 1024
    /// The most bytes of a sealed chunk in a `CHUNK`: a chunk is at most 4 MiB (`Chunker.Sizes.standard`), sealed it
    /// gains a 20-byte header, up to 4 KiB of padding and length field, and a 16-byte tag.
    public static let maxSealedChunkBytes = (4 << 20) + 8192
    /// Bytes of a peer's `ERROR` reason kept.
    static let maxErrorBytes = 200
    /// The most bytes of operations one `MEMBERS` message carries (one larger operation goes alone), far below a
    /// sealed frame's 16 MiB.
    public static let membersMessageBytes = 1 << 20

    /// `ops` as `MEMBERS` messages of at most `membersMessageBytes` of operations each, parents before children: in
    /// the log's resolution `order` (hashes), those it does not name last, by hash. A peer keeps an operation only
    /// once it holds the operation that made its author an admin (`MembershipLog.kept`).
    public static func members(chunking unordered: [MembershipOp], order: [EntryHash]) -> [PeerMessage] {
        let position = Dictionary(order.enumerated().map { ($1, $0) }, uniquingKeysWith: { a, _ in a })
        let ops = unordered.sorted { a, b in
            let (pa, pb) = (position[a.hash] ?? Int.max, position[b.hash] ?? Int.max)
            return pa != pb ? pa < pb : a.hash < b.hash
        }
        var out: [PeerMessage] = []
        var chunk: [MembershipOp] = []
        var bytes = 0
        for op in ops {
            if bytes + op.bytes.count > membersMessageBytes && !chunk.isEmpty {
                out.append(.members(chunk))
                (chunk, bytes) = ([], 0)
            }
            chunk.append(op)
            bytes += op.bytes.count
        }
        if !chunk.isEmpty { out.append(.members(chunk)) }
        return out
    }

    /// The message's bytes; throws for a batch that is not one origin's linked run (a damaged local log).
    public func encoded() throws(SyncRejection) -> [UInt8] {
        switch self {
        case .state(let vector, let head):
            var out: [UInt8] = [Self.stateType]
            out.appendBE(UInt32(vector.count))
            for (origin, seq) in vector.sorted(by: { $0.key < $1.key }) {
                out += origin.bytes
                out.appendBE(seq)
            }
            if let head { out += head.bytes }
            return out
        case .entries(let batch):
            var out: [UInt8] = [Self.entriesType]
            out += batch.head.bytes
            out.appendBE(UInt32(batch.entries.count))
            try EntryRun.pack(batch.entries, into: &out)
            return out
        case .error(let reason):
            return [Self.errorType] + Array(reason.utf8.prefix(Self.maxErrorBytes))
        case .ping:
            return [Self.pingType]
        case .members(let ops):
            var out: [UInt8] = [Self.membersType]
            out.appendBE(UInt32(ops.count))
            for op in ops {
                out.appendBE(UInt32(op.bytes.count))
                out += op.bytes
            }
            return out
        case .join(let id, let device, let proof):
            return [Self.joinType] + id + device.signing + device.agreement + proof
        case .acks(let acks):
            var out: [UInt8] = [Self.acksType]
            out.appendBE(UInt32(acks.count))
            for ack in acks {
                out.appendBE(UInt32(ack.bytes.count))
                out += ack.bytes
            }
            return out
        case .snapshotPart(let part):
            return [Self.snapshotPartType] + part.bytes
        case .snapshot(let manifest):
            return [Self.snapshotType] + manifest.bytes
        case .joinRefused(let id, let device, let reason):
            return [Self.joinRefusedType] + id + device + Array(reason.rawValue.utf8)
        case .chunkWant(let ids):
            return Self.encode(ids, type: Self.chunkWantType)
        case .chunk(let id, let sealed):
            var out = Self.chunkHeader(id)
            out.reserveCapacity(1 + ChunkID.count + sealed.count)
            out += sealed
            return out
        case .chunkMissing(let ids):
            return Self.encode(ids, type: Self.chunkMissingType)
        case .chunkOffer(let ids):
            return Self.encode(ids, type: Self.chunkOfferType)
        case .chunkBad(let ids):
            return Self.encode(ids, type: Self.chunkBadType)
        case .chunkKeep(let ids):
            return Self.encode(ids, type: Self.chunkKeepType)
        case .formats(let statements):
            var out: [UInt8] = [Self.formatsType]
            out.appendBE(UInt16(statements.count))
            for s in statements { out += s.bytes }
            return out
        case .clock(let ms):
            var out: [UInt8] = [Self.clockType]
            out.appendBE(ms)
            return out
        }
    }

    /// A list of chunk ids as a message of `type`: its count (2 bytes, big-endian), then the ids.
    private static func encode(_ ids: [ChunkID], type: UInt8) -> [UInt8] {
        var out: [UInt8] = [type]
        out.appendBE(UInt16(ids.count))
        for id in ids { out += id.bytes }
        return out
    }

    /// A list of 1 (0 when `empty`) to `maxChunkWants` distinct chunk ids filling the rest of the message, or
    /// `malformed`.
    private static func chunkIDs(_ r: inout ByteReader, empty: Bool = false, most: Int = maxChunkWants) throws(SyncRejection) -> [ChunkID] {
        guard let n = r.readUInt16(), n > 0 || empty, Int(n) <= most, r.remaining == Int(n) * ChunkID.count else {
            throw .malformed
        }
        var ids: [ChunkID] = []
        var seen: Set<ChunkID> = []
        for _ in 0..<n {
            guard let bytes = r.read(ChunkID.count), let id = ChunkID(bytes: bytes), seen.insert(id).inserted else {
                throw .malformed
            }
            ids.append(id)
        }
        return ids
    }

    /// Decodes one message, refusing anything malformed or out of bounds (SYNC.md §8).
    public init(decoding bytes: [UInt8]) throws(SyncRejection) {
        var r = ByteReader(bytes[...])
        switch r.readUInt8() {
        case Self.stateType?:
            guard let n = r.readUInt32(), Int(n) <= r.remaining / 24 else { throw .malformed }
            var vector: [NodeID: UInt64] = [:]
            for _ in 0..<n {
                // A seq of 0 says nothing; one at or past the bound no real log reaches (SYNC.md §8).
                guard let o = r.read(16), let s = r.readUInt64(), s < SyncBounds.maxSeq else { throw .malformed }
                let origin = NodeID(bytes: o)
                guard vector.updateValue(s, forKey: origin) == nil else { throw .malformed }
            }
            self = .state(vector: vector, ownHead: r.remaining == 0 ? nil : try SignedHead(bytes: r.rest()))
        case Self.entriesType?:
            guard let h = r.read(SignedHead.size), let n = r.readUInt32(), n > 0 else { throw .malformed }
            let head = try SignedHead(bytes: h)
            let entries = try EntryRun.unpack(&r, count: Int(n))
            guard r.remaining == 0 else { throw .malformed }
            self = .entries(EntryBatch(origin: NodeID(bytes: head.origin), entries: entries, head: head))
        case Self.errorType?:
            // A peer's words end up in logs and `sync.status`: at most 200 bytes, control characters replaced.
            let text = String(decoding: r.rest().prefix(Self.maxErrorBytes), as: UTF8.self)
            self = .error(String(text.unicodeScalars.map { $0.value < 0x20 || $0.value == 0x7F ? "?" : Character($0) }))
        case Self.pingType?:
            guard r.remaining == 0 else { throw .malformed }
            self = .ping
        case Self.membersType?:
            // Bounds before allocation: every operation takes at least its length prefix and its smallest encoding.
            guard let n = r.readUInt32(), Int(n) <= r.remaining / 4 else { throw .malformed }
            var ops: [MembershipOp] = []
            for _ in 0..<n {
                guard let length = r.readUInt32(), let bytes = r.read(Int(length)),
                    let op = try? MembershipOp(unverified: Array(bytes))
                else { throw .malformed }
                ops.append(op)
            }
            guard r.remaining == 0 else { throw .malformed }
            self = .members(ops)
        case Self.joinType?:
            guard let id = r.read(16), let signing = r.read(32), let agreement = r.read(32),
                let device = DevicePublicKeys(signing: Array(signing), agreement: Array(agreement)),
                r.remaining == 32 || r.remaining == 64, let proof = r.read(r.remaining)
            else { throw .malformed }
            self = .join(id: Array(id), device: device, proof: Array(proof))
        case Self.acksType?:
            // Each acknowledgement is verified when decoded; bounds come before allocation.
            guard let n = r.readUInt32(), Int(n) <= r.remaining / 4 else { throw .malformed }
            var acks: [Acknowledgement] = []
            for _ in 0..<n {
                guard let length = r.readUInt32(), let bytes = r.read(Int(length)) else { throw .malformed }
                acks.append(try Acknowledgement(bytes: Array(bytes)))
            }
            guard r.remaining == 0 else { throw .malformed }
            self = .acks(acks)
        case Self.snapshotPartType?:
            self = .snapshotPart(try SnapshotPart(bytes: Array(r.rest())))
        case Self.snapshotType?:
            self = .snapshot(try SnapshotManifest(bytes: Array(r.rest())))
        case Self.joinRefusedType?:
            guard let id = r.read(16), let device = r.read(32), r.remaining <= 32,
                let reason = InviteRefusal(rawValue: String(decoding: r.rest(), as: UTF8.self))
            else { throw .malformed }
            self = .joinRefused(id: Array(id), device: Array(device), reason: reason)
        case Self.chunkWantType?:
            self = .chunkWant(try Self.chunkIDs(&r, empty: true))
        case Self.chunkType?:
            guard let bytes = r.read(ChunkID.count), let id = ChunkID(bytes: bytes), r.remaining > 0,
                r.remaining <= Self.maxSealedChunkBytes
            else { throw .malformed }
            self = .chunk(id: id, sealed: r.rest())
        case Self.chunkMissingType?:
            self = .chunkMissing(try Self.chunkIDs(&r))
        case Self.chunkOfferType?:
            self = .chunkOffer(try Self.chunkIDs(&r))
        case Self.chunkBadType?:
            self = .chunkBad(try Self.chunkIDs(&r))
        case Self.clockType?:
            // A time no real clock shows (past 2^62 ms) is refused like any other bound.
            guard let ms = r.readUInt64(), ms < 1 << 62, r.remaining == 0 else { throw .malformed }
            self = .clock(ms: ms)
        case Self.formatsType?:
            // Fixed-size statements, the count checked against the bytes first. Their signatures are checked by the
            // receiver, once it knows the signers are members (a bad one is skipped there, not the whole message).
            guard let n = r.readUInt16(), n >= 1, Int(n) <= Self.maxStatements, r.remaining == Int(n) * FormatStatement.size else {
                throw .malformed
            }
            var statements: [FormatStatement] = []
            for _ in 0..<n { statements.append(try FormatStatement(unverified: Array(r.read(FormatStatement.size)!))) }
            self = .formats(statements)
        case Self.chunkKeepType?:
            self = .chunkKeep(try Self.chunkIDs(&r, most: Self.maxChunkKeep))
        default:
            throw .malformed
        }
    }
}
