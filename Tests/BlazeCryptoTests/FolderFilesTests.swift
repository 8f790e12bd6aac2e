import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

@testable import BlazeCrypto

/// The files of a folder container (SYNC.md §10), decoded as hostile input.
@Suite struct FolderFilesTests {
    let key = SpaceKey.generate()
    let device = DeviceIdentity()

    @Test func segmentsAreNamedByNumberAndOtherNamesAreNotTheirs() {
        #expect(FolderFiles.segmentName(1) == "0000000000000001.seg")
        #expect(FolderFiles.segmentName(0xabc) == "0000000000000abc.seg")
        for n: UInt64 in [1, 255, 1 << 40, .max] { #expect(FolderFiles.segmentNumber(FolderFiles.segmentName(n)) == n) }
        for name in [
            "0000000000000ABC.seg", "000000000000001.seg", "0000000000000001.seg.tmp", "0000000000000001 (conflicted copy).seg",
            "0000000000000001.sync-conflict-20261123-1.seg", "head", "000000000000000g.seg", "+000000000000001.seg",
        ] {
            #expect(FolderFiles.segmentNumber(name) == nil, "\(name)")
        }
    }

    @Test func segmentHeadersNameTheirSpaceAndWriter() {
        let writer = device.nodeID
        let header = FolderFiles.segmentHeader(space: key.id, writer: writer, number: 3)
        #expect(header.count == FolderFiles.segmentHeaderSize)
        #expect(FolderFiles.checkSegmentHeader(header[...], space: key.id, writer: writer))
        #expect(!FolderFiles.checkSegmentHeader(header[...], space: SpaceKey.generate().id, writer: writer))
        #expect(!FolderFiles.checkSegmentHeader(header[...], space: key.id, writer: DeviceIdentity().nodeID))
        #expect(!FolderFiles.checkSegmentHeader(header.dropLast(), space: key.id, writer: writer))
        var other = header
        other[4] = 2  // a version this build does not read
        #expect(!FolderFiles.checkSegmentHeader(other[...], space: key.id, writer: writer))
        #expect(FolderFiles.segmentHeaderProblem(other[...], space: key.id, writer: writer) == .incompatibleProtocol)
        other[4] = 0
        #expect(FolderFiles.segmentHeaderProblem(other[...], space: key.id, writer: writer) == .malformed)
    }

    @Test func aFileOfANewerFormatIsSaidToBeNewerNotMalformed() throws {
        let (_, own) = makeChain(1, key: key, device: device)
        var head = FolderFiles.Head.encode(space: key.id, identity: device, generation: 1, timeMs: 0, segment: 1, ownHead: own)
        var members = FolderFiles.members(space: key.id, ops: [[1, 2]])
        var acks = FolderFiles.acks(space: key.id, acks: [[3]])
        for v: UInt8 in [FolderFiles.version + 1, 255] {
            head[4] = v
            members[4] = v
            acks[4] = v
            #expect(throws: SyncRejection.incompatibleProtocol) { try FolderFiles.Head(bytes: head, space: key.id, writer: device.nodeID) }
            #expect(throws: SyncRejection.incompatibleProtocol) { try FolderFiles.decodeMembers(members, space: key.id) }
            #expect(throws: SyncRejection.incompatibleProtocol) { try FolderFiles.decodeAcks(acks, space: key.id) }
        }
        head[4] = 0
        #expect(throws: SyncRejection.malformed) { try FolderFiles.Head(bytes: head, space: key.id, writer: device.nodeID) }
    }

    @Test func recordsAreWholeCutShortOrDamagedAndNothingElse() {
        let body = (0..<300).map { UInt8(truncatingIfNeeded: $0 * 7) }
        let record = FolderFiles.record(body)
        let two = record + FolderFiles.record([1, 2, 3])
        guard case .record(let range, let size) = FolderFiles.scanRecord(two[...]) else {
            Issue.record("a whole record is read")
            return
        }
        #expect(Array(two[range]) == body && size == record.count)
        guard case .record(let range2, _) = FolderFiles.scanRecord(two[size...]) else {
            Issue.record("the next record is read from its offset")
            return
        }
        #expect(Array(two[range2]) == [1, 2, 3])
        // Every cut of a record (a write in progress, a half-copied file) is incomplete, never damaged or a record.
        for cut in 0..<record.count { #expect(FolderFiles.scanRecord(record.prefix(cut)) == .incomplete, "cut at \(cut)") }
        // Any flipped bit after the length fails the checksum.
        var random = SeededRandom(seed: testSeed("folder record bits"))
        for _ in 0..<200 {
            var bad = record
            let i = Int.random(in: 4..<bad.count, using: &random)
            bad[i] ^= 1 << UInt8.random(in: 0..<8, using: &random)
            #expect(FolderFiles.scanRecord(bad[...]) == .damaged, "bit flipped at \(i)")
        }
        // Lengths out of bounds are damage at once, before waiting for bytes that would never come.
        var zero: [UInt8] = []
        zero.appendBE(UInt32(0))
        #expect(FolderFiles.scanRecord((zero + [UInt8](repeating: 0, count: 8))[...]) == .damaged)
        var huge: [UInt8] = []
        huge.appendBE(UInt32(FolderFiles.maxRecordBody + 1))
        #expect(FolderFiles.scanRecord((huge + [UInt8](repeating: 0, count: 8))[...]) == .damaged)
    }

    @Test func headFilesVerifyAndAnyAlterationIsRefused() throws {
        let (entries, own) = makeChain(3, key: key, device: device)
        _ = entries
        let held: [[UInt8]: UInt64] = [device.nodeID: 3, DeviceIdentity().nodeID: 41]
        let bytes = FolderFiles.Head.encode(
            space: key.id, identity: device, generation: 7, timeMs: 123, segment: 2, ownHead: own, held: held)
        let head = try FolderFiles.Head(bytes: bytes, space: key.id, writer: device.nodeID)
        #expect(head.generation == 7 && head.segment == 2 && head.timeMs == 123 && head.ownHead == own && head.writer == device.nodeID)
        #expect(head.held == held)
        let empty = FolderFiles.Head.encode(space: key.id, identity: device, generation: 1, timeMs: 0, segment: 0, ownHead: nil)
        #expect(try FolderFiles.Head(bytes: empty, space: key.id, writer: device.nodeID).ownHead == nil)
        // In another writer's directory, or another space's, it is refused.
        #expect(throws: SyncRejection.badHead) { try FolderFiles.Head(bytes: bytes, space: key.id, writer: DeviceIdentity().nodeID) }
        #expect(throws: SyncRejection.wrongSpace) { try FolderFiles.Head(bytes: bytes, space: SpaceKey.generate().id, writer: device.nodeID) }
        // Every flipped byte and every cut is refused.
        for i in 0..<bytes.count {
            var bad = bytes
            bad[i] ^= 0x10
            #expect(throws: SyncRejection.self) { try FolderFiles.Head(bytes: bad, space: key.id, writer: device.nodeID) }
        }
        for cut in 0..<bytes.count {
            #expect(throws: SyncRejection.self) { try FolderFiles.Head(bytes: Array(bytes.prefix(cut)), space: key.id, writer: device.nodeID) }
        }
        #expect(throws: SyncRejection.malformed) { try FolderFiles.Head(bytes: bytes + [0], space: key.id, writer: device.nodeID) }
        // A writer cannot present another device's head as its own.
        let other = DeviceIdentity()
        let (_, otherHead) = makeChain(1, key: key, device: other)
        let borrowed = FolderFiles.Head.encode(space: key.id, identity: device, generation: 1, timeMs: 0, segment: 1, ownHead: otherHead)
        #expect(throws: SyncRejection.badHead) { try FolderFiles.Head(bytes: borrowed, space: key.id, writer: device.nodeID) }
    }

    @Test func membersFilesDecodeWithinTheirBounds() throws {
        let ops: [[UInt8]] = [[1, 2, 3], [], Array(repeating: 9, count: 1000)]
        let bytes = FolderFiles.members(space: key.id, ops: ops)
        #expect(try FolderFiles.decodeMembers(bytes, space: key.id) == ops)
        #expect(throws: SyncRejection.wrongSpace) { try FolderFiles.decodeMembers(bytes, space: SpaceKey.generate().id) }
        #expect(throws: SyncRejection.malformed) { try FolderFiles.decodeMembers(bytes + [0], space: key.id) }
        for cut in 0..<bytes.count {
            #expect(throws: SyncRejection.self) { try FolderFiles.decodeMembers(Array(bytes.prefix(cut)), space: key.id) }
        }
        // A count no file of this size can hold is refused before anything is allocated.
        var lying = FolderFiles.membersMagic + [FolderFiles.version] + key.id.bytes
        lying.appendBE(UInt32.max)
        #expect(throws: SyncRejection.malformed) { try FolderFiles.decodeMembers(lying, space: key.id) }
    }
}
