// The replicated state of one field of a document (its writes, counter increments and set elements) and how it
// materializes. The document's state is in DocumentState.swift.

import BlazeProtocol

/// A write of a field: a value, or nil for "absent" (unset).
public struct FieldWrite: Hashable, Sendable {
    /// When and by which operation.
    public let stamp: Stamp
    /// The value written; nil for unset.
    public let value: JSONValue?
}

/// A counter increment or a set addition kept on top of the field's winning write.
public struct FieldTag: Hashable, Sendable {
    /// When and by which operation.
    public let stamp: Stamp
    /// The delta (counters) or the element (sets).
    public let value: JSONValue
}

/// The replicated state of one top-level field at the document's current causal length.
public struct FieldState: Hashable, Sendable {
    /// The winning LWW write (largest stamp); nil when only counter/set operations touched the field.
    public var winner: FieldWrite?
    /// Everything besides the winner, out of line (one heap box) and nil when all of it is empty. Most fields are a
    /// plain write, and field states are copied whenever a document's fields are iterated: the box keeps that copy
    /// to two references.
    private var boxed: Boxed?

    /// The heap box of `rest`.
    indirect enum Boxed: Hashable, Sendable {
        case rest(Rest)

        var value: Rest {
            switch self {
            case .rest(let r): return r
            }
        }
    }

    /// The parts other than the winner; nil when all are empty.
    var rest: Rest? { boxed?.value }

    /// The parts of a field state other than its winner.
    struct Rest: Hashable, Sendable {
        var increments: [FieldTag] = []
        var additions: [FieldTag] = []
        var removedFromWinner: Set<String> = []
        var lastSetOp: Stamp?
        var losers: [FieldWrite] = []

        var isEmpty: Bool {
            increments.isEmpty && additions.isEmpty && removedFromWinner.isEmpty && lastSetOp == nil && losers.isEmpty
        }
    }

    /// Increments with stamps after the winner, in stamp order.
    public var increments: [FieldTag] {
        get { rest?.increments ?? [] }
        set { update { $0.increments = newValue } }
    }
    /// Set additions after the winner that no observing removal has removed, in stamp order.
    public var additions: [FieldTag] {
        get { rest?.additions ?? [] }
        set { update { $0.additions = newValue } }
    }
    /// Canonical texts of elements removed from the winner's array by removals that observed the winner.
    public var removedFromWinner: Set<String> {
        get { rest?.removedFromWinner ?? [] }
        set { update { $0.removedFromWinner = newValue } }
    }
    /// The latest set operation's stamp, if after the winner: the field is then shown as a set.
    public var lastSetOp: Stamp? {
        get { rest?.lastSetOp }
        set { update { $0.lastSetOp = newValue } }
    }
    /// Concurrent writes that lost to the winner and that no later write has observed, in stamp order.
    public var losers: [FieldWrite] {
        get { rest?.losers ?? [] }
        set { update { $0.losers = newValue } }
    }

    /// Edits `rest` in place (its storage is released first, so `edit` mutates uniquely referenced arrays).
    private mutating func update(_ edit: (inout Rest) -> Void) {
        var r = boxed?.value ?? Rest()
        boxed = nil
        edit(&r)
        boxed = r.isEmpty ? nil : .rest(r)
    }

    /// Creates an empty field state.
    public init() {}

    /// A field state from its parts (`rest` is boxed only when it holds something).
    init(winner: FieldWrite?, rest: Rest) {
        self.winner = winner
        boxed = rest.isEmpty ? nil : .rest(rest)
    }

    /// A field that is one LWW write of `value` (nil: unset) at `stamp`.
    static func plain(_ stamp: Stamp, _ value: JSONValue?) -> FieldState {
        var f = FieldState()
        f.winner = FieldWrite(stamp: stamp, value: value)
        return f
    }

    /// True when the field is a plain LWW write with nothing else.
    var isPlainWrite: Bool { winner != nil && boxed == nil }

    var isEmpty: Bool { winner == nil && boxed == nil }

    mutating func write(_ w: FieldWrite, in change: Change, at index: Int) {
        if boxed != nil { losers.removeAll { change.observes($0.stamp.dot, at: index) } }
        guard let current = winner, w.stamp < current.stamp else {
            if let old = winner, !change.observes(old.stamp.dot, at: index) { insertLoser(old) }
            winner = w
            if boxed != nil {
                removedFromWinner = []
                increments.removeAll { $0.stamp < w.stamp }
                additions.removeAll { $0.stamp < w.stamp }
                if let s = lastSetOp, s < w.stamp { lastSetOp = nil }
            }
            return
        }
        // Under causal delivery the winner cannot have observed `w`, so `w` lost to a concurrent write.
        insertLoser(w)
    }

    private mutating func insertLoser(_ w: FieldWrite) {
        let at = losers.firstIndex { w.stamp < $0.stamp } ?? losers.count
        losers.insert(w, at: at)
    }

    private func isAfterWinner(_ stamp: Stamp) -> Bool { winner.map { $0.stamp < stamp } ?? true }

    mutating func increment(_ delta: JSONValue, stamp: Stamp) {
        guard isAfterWinner(stamp) else { return }
        insertTag(FieldTag(stamp: stamp, value: delta), into: &increments)
    }

    mutating func add(_ element: JSONValue, stamp: Stamp) {
        guard isAfterWinner(stamp) else { return }
        insertTag(FieldTag(stamp: stamp, value: element), into: &additions)
        if lastSetOp.map({ $0 < stamp }) ?? true { lastSetOp = stamp }
    }

    /// Applies a set removal. `inherited` is the write of an enclosing object that shows through a nested field
    /// without a write of its own (its stamp, and its value at this field's path).
    mutating func remove(
        _ element: JSONValue, stamp: Stamp, in change: Change, at index: Int, inherited: FieldWrite? = nil
    ) {
        let text = element.jsonText
        additions.removeAll { $0.value.jsonText == text && change.observes($0.stamp.dot, at: index) }
        if let w = winner ?? inherited, change.observes(w.stamp.dot, at: index), case .array(let items)? = w.value,
            items.contains(where: { $0.jsonText == text })
        {
            removedFromWinner.insert(text)
        }
        if isAfterWinner(stamp), lastSetOp.map({ $0 < stamp }) ?? true { lastSetOp = stamp }
    }

    private func insertTag(_ tag: FieldTag, into tags: inout [FieldTag]) {
        if tags.contains(where: { $0.stamp == tag.stamp && $0.value == tag.value }) { return }
        let at = tags.firstIndex { tag.stamp < $0.stamp } ?? tags.count
        tags.insert(tag, at: at)
    }

    /// Drops every part older than `stamp`: a write of an enclosing object at `stamp` hides them (SYNC.md §2,
    /// "Nested fields"). Hidden set elements refer to the write the field showed, so they go unless the field's own
    /// winner stays.
    mutating func drop(before stamp: Stamp) {
        if let w = winner, w.stamp < stamp {
            winner = nil
            if boxed != nil { removedFromWinner = [] }
        } else if winner == nil, boxed != nil {
            removedFromWinner = []
        }
        guard boxed != nil else { return }
        increments.removeAll { $0.stamp < stamp }
        additions.removeAll { $0.stamp < stamp }
        if let s = lastSetOp, s < stamp { lastSetOp = nil }
        losers.removeAll { $0.stamp < stamp }
    }

    /// The field's value, or nil when absent (see Protocol/SYNC.md, "Materialization").
    public var value: JSONValue? { value(inherited: nil) }

    /// The field's value when a nested field without a write of its own shows `inherited` (the value at its path in
    /// the enclosing object's write) as its base.
    public func value(inherited: JSONValue?) -> JSONValue? {
        let base = winner != nil ? winner!.value : inherited
        guard boxed != nil else { return base }
        if lastSetOp != nil || !additions.isEmpty || !removedFromWinner.isEmpty {
            var elements: [String: JSONValue] = [:]
            if case .array(let items)? = base {
                for item in items where !removedFromWinner.contains(item.jsonText) { elements[item.jsonText] = item }
            }
            for tag in additions { elements[tag.value.jsonText] = tag.value }
            return .array(elements.values.sorted { a, b in
                let c = TypeRank.compare(a, b)
                return c != 0 ? c < 0 : utf8Less(a.jsonText, b.jsonText)
            })
        }
        if !increments.isEmpty {
            var sum = CounterSum(start: base)
            for tag in increments { sum.add(tag.value) }
            return sum.value
        }
        return base
    }
}

/// Sums counter deltas in stamp order: integers stay integers until a double or an overflow appears.
struct CounterSum {
    var int: Int64?
    var double: Double

    init(start: JSONValue?) {
        switch start {
        case .int(let i)?: int = i; double = Double(i)
        case .double(let d)?: int = nil; double = d
        default: int = 0; double = 0
        }
    }

    mutating func add(_ delta: JSONValue) {
        switch delta {
        case .int(let d):
            if let i = int {
                let (r, overflow) = i.addingReportingOverflow(d)
                if overflow { int = nil; double = Double(i) + Double(d) } else { int = r; double = Double(r) }
            } else {
                double += Double(d)
            }
        case .double(let d):
            if let i = int { double = Double(i) }
            int = nil
            double += d
        default: break
        }
    }

    var value: JSONValue { int.map(JSONValue.int) ?? .double(double) }
}
