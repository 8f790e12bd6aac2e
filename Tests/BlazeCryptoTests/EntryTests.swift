import BlazeProtocol
import BlazeTestSupport
import Crypto
import Foundation
import Testing

@testable import BlazeCrypto

/// A chain of `count` entries of `device` in `key`'s space, and the head signing the last one.
func makeChain(_ count: Int, key: SpaceKey, device: DeviceIdentity, from first: UInt64 = 1, prev: [UInt8] = SealedEntry.genesis)
    -> (entries: [SealedEntry], head: SignedHead)
{
    var entries: [SealedEntry] = []
    var prev = prev
    for i in 0..<count {
        let seq = first + UInt64(i)
        let e = SealedEntry.seal(Array("change \(seq)".utf8), space: key, origin: device.nodeID, seq: seq, prev: prev)
        prev = e.hash
        entries.append(e)
    }
    return (entries, SignedHead(signing: entries.last!, identity: device))
}

@Suite struct EntryTests {
    let key = SpaceKey.generate()
    let device = DeviceIdentity()

    @Test func sealedEntriesOpenOnlyWithTheirSpaceKey() throws {
        let e = SealedEntry.seal(Array("hello".utf8), space: key, origin: device.nodeID, seq: 7, prev: SealedEntry.genesis)
        let parsed = try SealedEntry(bytes: e.bytes)
        #expect(parsed.header == e.header && parsed.header.seq == 7 && parsed.header.epoch == 1)
        #expect(try parsed.open(with: key) == Array("hello".utf8))
        // The payload is not visible in the bytes.
        #expect(!hexString(e.bytes).contains(hexString(Array("hello".utf8))))
        #expect(throws: SyncRejection.wrongSpace) { try parsed.open(with: SpaceKey.generate()) }
        let sameIDOtherSecret = try SpaceKey(id: key.id, epoch: 1, secrets: [1: [UInt8](repeating: 7, count: 32)])
        #expect(throws: SyncRejection.badSeal) { try parsed.open(with: sameIDOtherSecret) }
        let epoch2 = try SpaceKey(id: key.id, epoch: 2, secrets: [2: [UInt8](repeating: 7, count: 32)])
        #expect(throws: SyncRejection.unknownEpoch) { try parsed.open(with: epoch2) }
        #expect(throws: SyncRejection.malformed) { try SealedEntry(bytes: Array(e.bytes.prefix(EntryHeader.size + 15))) }
    }

    @Test func everySingleBitFlipIsRejected() throws {
        let e = SealedEntry.seal(Array("payload of some length".utf8), space: key, origin: device.nodeID, seq: 3, prev: SealedEntry.genesis)
        for bit in 0..<(e.bytes.count * 8) {
            var bytes = e.bytes
            bytes[bit / 8] ^= 1 << UInt8(bit % 8)
            let opened: [UInt8]? = (try? SealedEntry(bytes: bytes)).flatMap { try? $0.open(with: key) }
            #expect(opened == nil, "bit \(bit) flipped was accepted")
        }
    }

    @Test func packedRunsRebuildTheExactEntriesAndRefuseAnyAlteration() throws {
        let (entries, head) = makeChain(6, key: key, device: device, from: 4, prev: [UInt8](repeating: 9, count: 32))
        var packed: [UInt8] = []
        try EntryRun.pack(entries, into: &packed)
        let full = entries.reduce(0) { $0 + $1.bytes.count }
        // 72 bytes once, then per entry version, nonce, epoch and length (two varint bytes: a padded entry is at least
        // 144 bytes) instead of its 89-byte header.
        #expect(packed.count == full - 6 * EntryHeader.size + EntryRun.prefixSize + 6 * (1 + 12 + 1 + 2))
        var r = ByteReader(packed[...])
        let rebuilt = try EntryRun.unpack(&r, count: 6)
        #expect(r.remaining == 0 && rebuilt == entries && rebuilt.map(\.hash) == entries.map(\.hash))
        // Every single bit flip is refused: unpacking fails, or the rebuilt chain does not verify.
        for bit in 0..<(packed.count * 8) {
            var altered = packed
            altered[bit / 8] ^= 1 << UInt8(bit % 8)
            var reader = ByteReader(altered[...])
            let verified: [[UInt8]]? = (try? EntryRun.unpack(&reader, count: 6)).flatMap {
                reader.remaining == 0 ? try? EntryChain.verify($0, head: head, previousHash: entries[0].header.prev, key: key) : nil
            }
            #expect(verified == nil, "bit \(bit) flipped was accepted")
        }
        // Only one origin's consecutive, linked entries pack.
        var out: [UInt8] = []
        #expect(throws: SyncRejection.malformed) { try EntryRun.pack([entries[0], entries[2]], into: &out) }
        #expect(throws: SyncRejection.malformed) { try EntryRun.pack([], into: &out) }
        var short = ByteReader(packed.dropLast()[...])
        #expect(throws: SyncRejection.malformed) { try EntryRun.unpack(&short, count: 6) }
        var tooMany = ByteReader(packed[...])
        #expect(throws: SyncRejection.malformed) { try EntryRun.unpack(&tooMany, count: 1_000_000) }
    }

    @Test func paddingHidesTheExactSizeAndVersionOneEntriesStillOpen() throws {
        // Buckets: 128 bytes at least, then Padmé sizes; never smaller than the plaintext, at most 12 % more.
        #expect(EntryPadding.bucket(1) == 128 && EntryPadding.bucket(128) == 128 && EntryPadding.bucket(129) == 144)
        #expect(EntryPadding.bucket(1000) == 1024 && EntryPadding.bucket(100_000) == 100_352)
        for n in stride(from: 1, through: 3_000_000, by: 997) {
            let b = EntryPadding.bucket(n)
            #expect(b >= n && (n <= 128 || Double(b) <= Double(n) * 1.12), "\(n) → \(b)")
        }
        // Payloads of 1 to 127 bytes all seal to one size; each opens to exactly what was sealed.
        var sizes = Set<Int>()
        for n in [0, 1, 50, 126, 127] {
            let payload = [UInt8](repeating: 0x41, count: n)
            let e = SealedEntry.seal(payload, space: key, origin: device.nodeID, seq: 1, prev: SealedEntry.genesis)
            #expect(try e.header.version == 2 && e.open(with: key) == payload)
            sizes.insert(e.bytes.count)
        }
        #expect(sizes == [EntryHeader.size + 128 + 16])
        // Trailing zeros of a payload survive: only the marker and what follows it are padding.
        let zeros: [UInt8] = [1, 0, 0, 0x80, 0, 0]
        #expect(try SealedEntry.seal(zeros, space: key, origin: device.nodeID, seq: 1, prev: SealedEntry.genesis).open(with: key) == zeros)
        // A version-1 entry (unpadded, sealed before padding) still opens, as it was.
        let plain = Array("a change sealed by an older version".utf8)
        let nonce = ChaChaPoly.Nonce()
        let header = EntryHeader(
            version: 1, space: key.id, origin: device.nodeID, seq: 1, prev: SealedEntry.genesis, epoch: key.epoch, nonce: Array(nonce))
        let box = try ChaChaPoly.seal(plain, using: try #require(key.sealing), nonce: nonce, authenticating: header.bytes)
        let old = try SealedEntry(bytes: header.bytes + box.ciphertext + box.tag)
        #expect(try old.header.version == 1 && old.open(with: key) == plain)
        var run: [UInt8] = []
        try EntryRun.pack([old], into: &run)
        var r = ByteReader(run[...])
        #expect(try EntryRun.unpack(&r, count: 1) == [old], "a version-1 entry travels as it was sealed")
        // A version-2 entry whose plaintext has no marker (sealed by a key holder, but wrongly) is refused.
        let unmarked = [UInt8](repeating: 0, count: 128)
        let nonce2 = ChaChaPoly.Nonce()
        let header2 = EntryHeader(space: key.id, origin: device.nodeID, seq: 1, prev: SealedEntry.genesis, epoch: key.epoch, nonce: Array(nonce2))
        let box2 = try ChaChaPoly.seal(unmarked, using: try #require(key.sealing), nonce: nonce2, authenticating: header2.bytes)
        #expect(throws: SyncRejection.badSeal) { try SealedEntry(bytes: header2.bytes + box2.ciphertext + box2.tag).open(with: key) }
        // A version-3 entry whose payload is not a packed one (sealed by a key holder, but wrongly) is refused.
        let header3 = EntryHeader(version: 3, space: key.id, origin: device.nodeID, seq: 1, prev: SealedEntry.genesis, epoch: key.epoch, nonce: Array(nonce2))
        let box3 = try ChaChaPoly.seal(EntryPadding.pad(Array(#"{"v":{"$vector":""}}"#.utf8)), using: try #require(key.sealing), nonce: nonce2, authenticating: header3.bytes)
        #expect(throws: SyncRejection.badPayload) { try SealedEntry(bytes: header3.bytes + box3.ciphertext + box3.tag).open(with: key) }
        // Unknown versions are refused when decoded.
        var future = header.bytes
        future[0] = EntryHeader.newestVersion + 1
        #expect(throws: SyncRejection.malformed) { try EntryHeader(decoding: future[...]) }
    }

    @Test func varintsRoundTripAndRefuseNonCanonicalForms() throws {
        for v: UInt64 in [0, 1, 127, 128, 300, 16_383, 16_384, UInt64(UInt32.max), .max] {
            var out: [UInt8] = []
            out.appendVarint(v)
            var r = ByteReader(out[...])
            #expect(r.readVarint() == v && r.remaining == 0)
        }
        for bad: [UInt8] in [[0x80], [0x80, 0x00], [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x02], []] {
            var r = ByteReader(bad[...])
            #expect(r.readVarint() == nil, "\(bad)")
        }
    }

    @Test func chainsVerifyUpToTheSignedHead() throws {
        let (entries, head) = makeChain(5, key: key, device: device)
        let payloads = try EntryChain.verify(entries, head: head, previousHash: nil, key: key)
        #expect(payloads.map { String(decoding: $0, as: UTF8.self) } == (1...5).map { "change \($0)" })
        let decoded = try SignedHead(bytes: head.bytes[...])
        #expect(decoded == head)
        // A continuation links to the previous batch's last hash.
        let (more, head2) = makeChain(3, key: key, device: device, from: 6, prev: entries.last!.hash)
        #expect(try EntryChain.verify(more, head: head2, previousHash: entries.last!.hash, key: key).count == 3)
        #expect(throws: SyncRejection.brokenChain) {
            try EntryChain.verify(more, head: head2, previousHash: entries[3].hash, key: key)
        }
    }

    @Test func tamperedChainsAndHeadsAreRejectedWithTheirReason() throws {
        let (entries, head) = makeChain(4, key: key, device: device)
        // An entry left out or swapped.
        #expect(throws: SyncRejection.malformed) {
            try EntryChain.verify([entries[0], entries[2], entries[3]], head: head, previousHash: nil, key: key)
        }
        // An entry replaced by another one with the same seq, sealed by a key holder but not chained.
        let forged = SealedEntry.seal(Array("forged".utf8), space: key, origin: device.nodeID, seq: 2, prev: SealedEntry.genesis)
        #expect(throws: SyncRejection.brokenChain) {
            try EntryChain.verify([entries[0], forged, entries[2], entries[3]], head: head, previousHash: nil, key: key)
        }
        // A head that stops earlier than the batch, or signs another hash.
        let early = SignedHead(signing: entries[2], identity: device)
        #expect(throws: SyncRejection.badHead) { try EntryChain.verify(entries, head: early, previousHash: nil, key: key) }
        // A head signed by another device claiming this origin.
        let mallory = DeviceIdentity()
        var forgedHead = SignedHead(signing: entries[3], identity: mallory).bytes
        forgedHead.replaceSubrange(0..<16, with: device.nodeID)
        #expect(throws: SyncRejection.badHead) {
            try EntryChain.verify(entries, head: try SignedHead(bytes: forgedHead[...]), previousHash: nil, key: key)
        }
        // A signature bit flipped.
        var flipped = head.bytes
        flipped[flipped.count - 1] ^= 1
        #expect(throws: SyncRejection.badHead) {
            try EntryChain.verify(entries, head: try SignedHead(bytes: flipped[...]), previousHash: nil, key: key)
        }
        // A head of this space replayed into another one.
        let other = SpaceKey.generate()
        #expect(throws: SyncRejection.badHead) { try EntryChain.verify(entries, head: head, previousHash: nil, key: other) }
        // The first entry of a log must start from the genesis hash.
        let (late, lateHead) = makeChain(2, key: key, device: device, from: 1, prev: entries[0].hash)
        #expect(throws: SyncRejection.brokenChain) { try EntryChain.verify(late, head: lateHead, previousHash: nil, key: key) }
    }

    @Test func tokensRoundTripAndDamageIsExplained() throws {
        let token = try #require(key.token)
        #expect(token.hasPrefix("blazedb-secret-1."))
        #expect(try SpaceKey(token: token) == key)
        #expect(throws: KeystoreError.self) { try SpaceKey(token: "hello") }
        #expect(throws: KeystoreError.self) { try SpaceKey(token: String(token.dropLast(3))) }
        #expect(throws: KeystoreError.self) { try SpaceKey(token: token + "AAAA") }
    }

    @Test func spaceKeysAreStoredPrivately() throws {
        let dir = NSTemporaryDirectory() + "blazespaces-\(UUID().uuidString)/spaces"
        defer { try? FileManager.default.removeItem(atPath: (dir as NSString).deletingLastPathComponent) }
        try key.save(directory: dir)
        #expect(try SpaceKey.load(directory: dir, idHex: key.idHex) == key)
        #expect(try SpaceKey.load(directory: dir, idHex: SpaceKey.generate().idHex) == nil)
        let mode = try FileManager.default.attributesOfItem(atPath: dir + "/\(key.idHex).json")[.posixPermissions] as? NSNumber
        #expect(mode?.intValue == 0o600)
        chmod(dir + "/\(key.idHex).json", 0o640)
        #expect(throws: KeystoreError.self) { try SpaceKey.load(directory: dir, idHex: key.idHex) }
        SpaceKey.remove(directory: dir, idHex: key.idHex)
        #expect(!FileManager.default.fileExists(atPath: dir + "/\(key.idHex).json"))
    }
}
