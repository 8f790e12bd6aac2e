/// Why a received entry, head or frame was refused. The raw values are the counters' names in `sync.status`.
public enum SyncRejection: String, Error, Sendable, CaseIterable {
    /// True when the rejection condemns what the batch's origin signed, not the connection that carried it: the
    /// batch is refused and the origin skipped for the rest of the session, while other origins keep syncing.
    public var blamesOrigin: Bool {
        switch self {
        case .fork, .quarantined, .unknownEpoch, .badSeal, .badPayload, .invalidChange, .clockAhead, .notMember, .reader,
            .revoked, .tooManyParked:
            return true
        default: return false
        }
    }

    /// True for a refusal of an origin's batch that may not hold later: local time catches up with its clock
    /// (`clock_ahead`), what its parked changes wait for arrives (`too_many_parked`), or operations adding its origin
    /// or raising its role arrive (`not_a_member`, `reader`). Such a batch is worth fetching again.
    public var mayClear: Bool {
        switch self {
        case .clockAhead, .tooManyParked, .notMember, .reader: return true
        default: return false
        }
    }

    /// Not a well-formed entry or head.
    case malformed
    /// The entry names another space.
    case wrongSpace = "wrong_space"
    /// The entry's epoch has no key here.
    case unknownEpoch = "unknown_epoch"
    /// AEAD opening failed: tampered, or sealed with another key.
    case badSeal = "bad_seal"
    /// The plaintext is not the change the header announces.
    case badPayload = "bad_payload"
    /// `prev` does not match the hash of the origin's previous entry.
    case brokenChain = "broken_chain"
    /// The head's signature or key does not verify, or it does not match the last entry.
    case badHead = "bad_head"
    /// Two different entries for the same origin and sequence.
    case fork
    /// A head from an origin that is lower than one it signed before.
    case rollback
    /// A transport frame failed to authenticate or decode.
    case badFrame = "bad_frame"
    /// A signed change breaks the bounds of a real history (sequence, clock, causal length, names, types, sizes).
    case invalidChange = "invalid_change"
    /// The batch's origin forked earlier and is quarantined: nothing more of it is accepted.
    case quarantined
    /// A signed change's clock is further ahead of local time than the allowed window; refused until time catches up.
    case clockAhead = "clock_ahead"
    /// The entry's origin is not in the space's membership log (a relay, a stranger, a joiner not yet admitted).
    case notMember = "not_a_member"
    /// The entry's origin is a reader: members refuse its writes.
    case reader
    /// The entry's origin was removed and the entry lies past its removal's cutoff; on a handshake, the device at
    /// the other end was removed.
    case revoked
    /// The origin has as many changes parked (waiting for changes they depend on) as a device keeps; refused until
    /// those arrive.
    case tooManyParked = "too_many_parked"
    /// A relay refused to store more of the space: its quota of entries or bytes is used up.
    case overQuota = "over_quota"
    /// An acknowledgement's signature does not verify, or it names another space.
    case badAck = "bad_ack"
    /// A statement of entry formats whose signature does not verify (SYNC.md §6, "Entry formats").
    case badStatement = "bad_statement"
    /// A snapshot's signature, author, parts or content do not verify (SYNC.md §11).
    case badSnapshot = "bad_snapshot"
    /// A blob chunk that was not asked for, or whose seal, size or content does not match its id.
    case badChunk = "bad_chunk"
    /// A handshake whose two sides share no protocol version (`ProtocolMismatch` says which each speaks), or data of
    /// a format newer than this build reads.
    case incompatibleProtocol = "incompatible_protocol"
}
