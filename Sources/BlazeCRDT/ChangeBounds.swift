import BlazeProtocol

/// The bounds every change from another replica (or a backup file) is held to before any of it is applied
/// (SYNC.md §4): numbers a real history can produce, checked before arithmetic, so no hostile value can trap a
/// replica or poison its clock.
public enum ChangeBounds {
    /// Sequence numbers (of changes and in `deps`) are below 2^62.
    public static let maxSeq = SyncBounds.maxSeq
    /// Clocks are below 2^63: they are stored as non-negative SQLite integers, so signed and unsigned order agree.
    public static let maxClock: UInt64 = 1 << 63
    /// No causal length reaches 2^48, so `cl + 1` never overflows anywhere.
    public static let maxCausalLength: Int64 = 1 << 48
    /// Causal-length steps one change may account for: a change that has observed `n` changes (its `deps` plus
    /// itself) carries causal lengths of at most `n × causalStepsPerChange + 1`.
    public static let causalStepsPerChange: Int64 = 1 << 16
    /// How far ahead of local wall time a remote clock may be, by default: ten minutes.
    public static let defaultMaxClockAheadMilliseconds: UInt64 = 600_000

    /// Why a change broke the bounds.
    public enum Violation: Error, Equatable, Sendable, CustomStringConvertible {
        /// A sequence number (the change's own or in `deps`) outside `1..<maxSeq`.
        case sequence(UInt64)
        /// A clock at or above `maxClock`.
        case clock(UInt64)
        /// A clock more than the allowed window ahead of local wall time (milliseconds ahead).
        case clockAhead(UInt64)
        /// A causal length outside what the change's history can produce.
        case causalLength(Int64)
        /// An increment by something that is not a number.
        case increment(String)

        /// What was wrong, for logs and `invalid_change` messages.
        public var description: String {
            switch self {
            case .sequence(let s): return "sequence number \(s) is outside 1..<2^62"
            case .clock(let h): return "clock \(h) is at or above 2^63"
            case .clockAhead(let ms): return "clock is \(ms) ms ahead of local time"
            case .causalLength(let cl): return "causal length \(cl) is more than its history can produce"
            case .increment(let f): return "increment of field \(f) is not a number"
            }
        }
    }

    /// Checks everything about `change` that needs no local state: sequence numbers, clock range, causal lengths
    /// against the change's own history, increments' types. Deterministic, so every replica decides alike.
    public static func check(_ change: Change) throws(Violation) {
        guard change.seq > 0, change.seq < maxSeq else { throw .sequence(change.seq) }
        guard change.hlc.raw < maxClock else { throw .clock(change.hlc.raw) }
        // The changes this one has observed, itself included (saturating: deps are checked one by one).
        var observed = change.seq
        for (_, s) in change.deps.entries {
            guard s < maxSeq else { throw .sequence(s) }
            observed = observed &+ s
            if observed >= maxSeq { observed = maxSeq }
        }
        let (steps, overflow) = Int64(observed).multipliedReportingOverflow(by: causalStepsPerChange)
        let limit = overflow ? maxCausalLength : min(maxCausalLength, steps + 1)
        for op in change.ops {
            switch op {
            case .doc(let d):
                guard d.cl > 0, d.cl <= limit else { throw .causalLength(d.cl) }
                for (field, delta) in d.incr {
                    switch delta {
                    case .int, .double: break
                    default: throw .increment(field)
                    }
                }
            case .delete(_, let cl):
                guard cl > 0, cl <= limit else { throw .causalLength(cl) }
            case .index:
                break
            }
        }
    }

    /// Checks the change's clock against local wall time `now` (milliseconds): at most `maxAhead` ahead.
    public static func checkClock(_ change: Change, now: UInt64, maxAhead: UInt64) throws(Violation) {
        let ms = change.hlc.milliseconds
        let (limit, overflow) = now.addingReportingOverflow(maxAhead)
        guard overflow || ms <= limit else { throw .clockAhead(ms - now) }
    }
}

extension DocumentState {
    /// The largest clock of any stamp in the state (winners, increments, additions, set operations, losers).
    public var maxClock: HLC {
        var out = HLC(raw: 0)
        for f in fields.values {
            var stamps: [Stamp] = [f.winner?.stamp, f.lastSetOp].compactMap { $0 }
            stamps += f.increments.map(\.stamp) + f.additions.map(\.stamp) + f.losers.map(\.stamp)
            for s in stamps where s.hlc > out { out = s.hlc }
        }
        return out
    }
}
