import BlazeCrypto
import BlazeProtocol
import Testing

@testable import BlazeWire

/// The join messages' encodings (SYNC.md §8, "Messages"): what decodes, and what is refused before use.
@Suite struct MessageTests {
    @Test(arguments: InviteRefusal.allCases) func aJoinRefusalRoundTrips(reason: InviteRefusal) throws {
        let (id, device) = (SpaceKey.randomBytes(16), SpaceKey.randomBytes(32))
        let bytes = try PeerMessage.joinRefused(id: id, device: device, reason: reason).encoded()
        #expect(bytes.first == 10)
        guard case .joinRefused(let i, let d, let r) = try PeerMessage(decoding: bytes) else {
            Issue.record("decoded as another message")
            return
        }
        #expect(i == id && d == device && r == reason)
    }

    @Test func aJoinRefusalOfTheWrongShapeIsMalformed() {
        let head: [UInt8] = [10] + SpaceKey.randomBytes(48)
        for bad in [
            head,  // no reason
            head + Array("invite_stolen".utf8),  // not a reason a member gives
            head + Array("invite_used ".utf8),  // trailing bytes
            head + Array(repeating: UInt8(ascii: "a"), count: 64),  // too long
            [10] + SpaceKey.randomBytes(40),  // short keys
        ] {
            #expect(throws: SyncRejection.malformed) { try PeerMessage(decoding: bad) }
        }
    }

    @Test func aJoinRoundTripsAndOneOfTheWrongLengthIsMalformed() throws {
        let keys = DeviceIdentity().publicKeys
        let (id, proof) = (SpaceKey.randomBytes(16), SpaceKey.randomBytes(32))
        let bytes = try PeerMessage.join(id: id, device: keys, proof: proof).encoded()
        guard case .join(let i, let d, let p) = try PeerMessage(decoding: bytes) else {
            Issue.record("decoded as another message")
            return
        }
        #expect(i == id && d == keys && p == proof)
        #expect(throws: SyncRejection.malformed) { try PeerMessage(decoding: bytes + [0]) }
        #expect(throws: SyncRejection.malformed) { try PeerMessage(decoding: Array(bytes.dropLast())) }
    }

    @Test func aClockRoundTripsAndOneOutOfBoundsIsMalformed() throws {
        let bytes = try PeerMessage.clock(ms: 1_764_300_000_123).encoded()
        #expect(bytes.count == 9 && bytes.first == 17)
        guard case .clock(let ms) = try PeerMessage(decoding: bytes) else {
            Issue.record("decoded as another message")
            return
        }
        #expect(ms == 1_764_300_000_123)
        var late: [UInt8] = [17]
        late.appendBE(UInt64(1) << 62)
        for bad in [late, bytes + [0], Array(bytes.dropLast()), [17]] {
            #expect(throws: SyncRejection.malformed) { try PeerMessage(decoding: bad) }
        }
    }

    @Test func statementsOfFormatsRoundTripAndBadCountsOrSignaturesAreRefused() throws {
        let space = SpaceKey.generate().id
        let statements = (0..<3).map { i in FormatStatement(space: space, formats: 1...3, issuedMs: UInt64(i + 1), identity: DeviceIdentity()) }
        let bytes = try PeerMessage.formats(statements).encoded()
        #expect(bytes.first == 18 && bytes.count == 3 + 3 * FormatStatement.size)
        guard case .formats(let decoded) = try PeerMessage(decoding: bytes) else {
            Issue.record("decoded as another message")
            return
        }
        #expect(decoded == statements)
        #expect(decoded.allSatisfy { $0.isSigned })
        // A signature that does not hold decodes (the receiver checks it once it knows the signer is a member).
        var forged = bytes
        forged[forged.count - 1] ^= 1
        guard case .formats(let unchecked) = try PeerMessage(decoding: forged) else {
            Issue.record("decoded as another message")
            return
        }
        #expect(unchecked.map(\.isSigned) == [true, true, false])
        var many: [UInt8] = [18]
        many.appendBE(UInt16(PeerMessage.maxStatements + 1))
        for bad in [bytes + [0], Array(bytes.dropLast()), [18, 0, 0], [18], many + Array(bytes.dropFirst(3))] {
            #expect(throws: SyncRejection.malformed) { try PeerMessage(decoding: bad) }
        }
    }

    /// A long log goes in several `MEMBERS` messages of at most 1 MiB of operations, parents before children whatever
    /// order they are given in.
    @Test func aLongLogTravelsInBoundedMessagesParentsFirst() throws {
        let admin = DeviceIdentity()
        let salt = SpaceKey.randomBytes(16)
        let space = MembershipOp.spaceID(creator: admin.publicKeys, salt: salt)
        var ops = [try MembershipOp(space: space, author: admin, timeMs: 1, parents: [], action: .create(salt: salt), envelopes: [])]
        for i in 0..<6_000 {
            ops.append(
                try MembershipOp(
                    space: space, author: admin, timeMs: UInt64(2 + i), parents: [ops.last!.hash],
                    action: .add(device: DeviceIdentity().publicKeys, role: .reader), envelopes: []))
        }
        let order = MembershipState(space: space, ops: ops).order
        let messages = PeerMessage.members(chunking: ops.shuffled(), order: order)
        var sent: [MembershipOp] = []
        for message in messages {
            guard case .members(let chunk) = message else { throw SyncRejection.malformed }
            #expect(chunk.reduce(0) { $0 + $1.bytes.count } <= PeerMessage.membersMessageBytes)
            sent += chunk
        }
        #expect(messages.count > 1)
        #expect(sent.map(\.hash) == ops.map(\.hash), "each operation once, parents first")
    }
}
