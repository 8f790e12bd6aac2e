import CBlazeVectorKernels

/// How nearness is measured (Protocol/blazedb.openrpc.json, `VectorMetric`).
public enum VectorMetric: String, Sendable, CaseIterable {
    /// 1 − cos(a, b): 0 for the same direction, 2 for opposite ones (a zero vector is 1 from everything).
    case cosine
    /// Euclidean distance.
    case l2
    /// −(a · b): the larger the inner product, the nearer.
    case ip
}

/// One result of a nearest-neighbour search: the row's id and its distance from the query.
public struct VectorHit: Sendable, Equatable {
    /// The id the row was added under (the store's document row id).
    public let id: Int64
    /// The distance under the search's metric.
    public let distance: Float

    /// A hit.
    public init(id: Int64, distance: Float) {
        self.id = id
        self.distance = distance
    }

    /// Nearer first; equal distances by id, so a search has one answer.
    static func before(_ a: VectorHit, _ b: VectorHit) -> Bool {
        a.distance != b.distance ? a.distance < b.distance : a.id < b.id
    }
}

/// Vectors of one dimension held in one contiguous block, with each row's squared norm, for exact search: every
/// row's inner product with the query (SIMD), turned into the metric's distance, the k nearest kept in a heap.
///
/// Rows are keyed by an id (the store's document row id) and live in slots that never move while the matrix keeps
/// its `generation`: a removed or replaced row's slot is marked dead (skipped by searches) and a new vector takes a new
/// slot at the end, so a graph over the slots (`HNSWGraph`) stays valid as rows come and go. Once dead slots
/// outnumber live ones (and at least 1,024), the next change compacts the matrix and starts a new generation. Not
/// thread-safe: its owner serialises access.
public struct VectorMatrix: Sendable {
    /// Components per row.
    public let dimensions: Int
    /// The rows' components, slot after slot.
    var values: [Float] = []
    /// Each slot's squared norm.
    var squaredNorms: [Float] = []
    /// Each slot's id; `dead` for a removed row.
    var ids: [Int64] = []
    var slots: [Int64: Int] = [:]
    /// This matrix's slots' identity: new for each matrix and each compaction (a renumbering), so a graph over other
    /// slots is never used with these.
    public private(set) var generation = UInt64.random(in: 1...UInt64.max)

    /// The id of a dead slot.
    static let dead = Int64.min

    /// An empty matrix of rows of `dimensions` components.
    public init(dimensions: Int) {
        precondition(dimensions > 0)
        self.dimensions = dimensions
    }

    /// Rows held.
    public var count: Int { slots.count }

    /// Slots, live and dead.
    public var slotCount: Int { ids.count }

    /// Bytes the rows, norms and ids take (not counting the id map's table).
    public var bytes: Int { values.capacity * 4 + squaredNorms.capacity * 4 + ids.capacity * 8 }

    /// Makes room for `rows` rows in all (a load that knows its count holds no spare capacity).
    public mutating func reserve(_ rows: Int) {
        values.reserveCapacity(rows * dimensions)
        squaredNorms.reserveCapacity(rows)
        ids.reserveCapacity(rows)
        slots.reserveCapacity(rows)
    }

    /// Adds row `id` or replaces its vector (in a new slot); a vector of another dimension removes the row instead (it
    /// cannot be searched here).
    public mutating func set(_ id: Int64, _ vector: [Float]) {
        guard vector.count == dimensions, id != Self.dead else { return remove(id) }
        if let old = slots[id] { ids[old] = Self.dead }
        slots[id] = ids.count
        ids.append(id)
        values.append(contentsOf: vector)
        squaredNorms.append(Self.dot(vector, vector))
        compactIfSparse()
    }

    /// Removes row `id` (nothing when it is not held).
    public mutating func remove(_ id: Int64) {
        guard let slot = slots.removeValue(forKey: id) else { return }
        ids[slot] = Self.dead
        compactIfSparse()
    }

    /// Renumbers the live rows into slots 0..<count once dead slots outnumber them (and at least 1,024).
    private mutating func compactIfSparse() {
        let deadSlots = ids.count - slots.count
        guard deadSlots >= 1024, deadSlots > slots.count else { return }
        var compact = VectorMatrix(dimensions: dimensions)
        compact.reserve(slots.count)
        for slot in ids.indices where ids[slot] != Self.dead {
            compact.slots[ids[slot]] = compact.ids.count
            compact.ids.append(ids[slot])
            compact.values.append(contentsOf: values[slot * dimensions..<(slot + 1) * dimensions])
            compact.squaredNorms.append(squaredNorms[slot])
        }
        self = compact
    }

    /// The `k` rows nearest to `query` under `metric`, nearest first, among those `admits` lets through (all when
    /// nil). A query of another dimension finds nothing.
    public func nearest(
        to query: [Float], k: Int, metric: VectorMetric, admits: ((Int64) -> Bool)? = nil
    ) -> [VectorHit] {
        guard query.count == dimensions, k > 0, !ids.isEmpty else { return [] }
        let queryNorm = Self.dot(query, query)
        var heap = NearestHeap(k: k)
        let d = dimensions
        values.withUnsafeBufferPointer { v in
            query.withUnsafeBufferPointer { q in
                for slot in 0..<ids.count {
                    let id = ids[slot]
                    if id == Self.dead { continue }
                    if let admits, !admits(id) { continue }
                    heap.offer(VectorHit(id: id, distance: Self.rowDistance(v.baseAddress! + slot * d, q.baseAddress!, d, squaredNorms[slot], queryNorm, metric)))
                }
            }
        }
        return heap.sorted()
    }

    /// The `k` rows nearest to `query` under `metric` among the rows `ids` names (ids not held are skipped): the
    /// work is the candidates', not the matrix's, so a selective filter costs little.
    public func nearest(to query: [Float], k: Int, metric: VectorMetric, among ids: [Int64]) -> [VectorHit] {
        guard query.count == dimensions, k > 0, !self.ids.isEmpty else { return [] }
        let queryNorm = Self.dot(query, query)
        var heap = NearestHeap(k: k)
        let d = dimensions
        values.withUnsafeBufferPointer { v in
            query.withUnsafeBufferPointer { q in
                for id in ids {
                    guard let slot = slots[id] else { continue }
                    heap.offer(VectorHit(id: id, distance: Self.rowDistance(v.baseAddress! + slot * d, q.baseAddress!, d, squaredNorms[slot], queryNorm, metric)))
                }
            }
        }
        return heap.sorted()
    }

    /// The distance under `metric` of the row at `row` from the query at `query` (`dimensions` floats each), given
    /// their squared lengths: L2 from the differences (through the lengths, `|a|² + |b|² − 2a·b` loses the digits of
    /// two rows that nearly coincide, about 5e-4 for unit-sized values), the others from the inner product.
    @inline(__always)
    static func rowDistance(
        _ row: UnsafePointer<Float>, _ query: UnsafePointer<Float>, _ dimensions: Int, _ rowNorm: Float, _ queryNorm: Float,
        _ metric: VectorMetric
    ) -> Float {
        if metric == .l2 {
            let d = squaredDistance(row, query, dimensions).squareRoot()
            return d.isNaN ? .infinity : d
        }
        return distance(dot(row, query, dimensions), rowNorm, queryNorm, metric)
    }

    /// `hits` (rows of this matrix) with their L2 distances computed from the differences, nearest first; other
    /// metrics' as they are. The graph (`HNSWGraph`) finds its candidates through the squared lengths; this is what
    /// it reports.
    func exact(_ hits: [VectorHit], query: [Float], metric: VectorMetric) -> [VectorHit] {
        guard metric == .l2, query.count == dimensions else { return hits }
        let d = dimensions
        return values.withUnsafeBufferPointer { v in
            query.withUnsafeBufferPointer { q in
                hits.map { hit in
                    guard let slot = slots[hit.id] else { return hit }
                    let distance = Self.squaredDistance(v.baseAddress! + slot * d, q.baseAddress!, d).squareRoot()
                    return VectorHit(id: hit.id, distance: distance.isNaN ? .infinity : distance)
                }
            }
        }.sorted(by: VectorHit.before)
    }

    /// The squared L2 distance of `n` floats at `a` and `b`, from their differences, with the CPU's widest SIMD
    /// (`CBlazeVectorKernels`).
    @inline(__always)
    static func squaredDistance(_ a: UnsafePointer<Float>, _ b: UnsafePointer<Float>, _ n: Int) -> Float {
        blaze_l2sq_f32(a, b, n)
    }

    /// The squared L2 distance of `n` floats at `a` and `b` in Swift: two 8-wide accumulators, then the tail (the
    /// reference the kernels are tested against).
    static func swiftSquaredDistance(_ a: UnsafePointer<Float>, _ b: UnsafePointer<Float>, _ n: Int) -> Float {
        var s0 = SIMD8<Float>(), s1 = SIMD8<Float>()
        var i = 0
        let ra = UnsafeRawPointer(a), rb = UnsafeRawPointer(b)
        while i + 16 <= n {
            let d0 = ra.loadUnaligned(fromByteOffset: i * 4, as: SIMD8<Float>.self) - rb.loadUnaligned(fromByteOffset: i * 4, as: SIMD8<Float>.self)
            let d1 = ra.loadUnaligned(fromByteOffset: i * 4 + 32, as: SIMD8<Float>.self)
                - rb.loadUnaligned(fromByteOffset: i * 4 + 32, as: SIMD8<Float>.self)
            s0 += d0 * d0
            s1 += d1 * d1
            i += 16
        }
        var sum = (s0 + s1).sum()
        while i < n {
            let d = a[i] - b[i]
            sum += d * d
            i += 1
        }
        return sum
    }

    /// The distance under `metric` of two vectors from their inner product and squared norms.
    @inline(__always)
    static func distance(_ dot: Float, _ a: Float, _ b: Float, _ metric: VectorMetric) -> Float {
        let d: Float
        switch metric {
        case .ip: d = -dot
        case .l2: d = max(0, a + b - 2 * dot).squareRoot()
        case .cosine:
            let denominator = (a * b).squareRoot()
            d = denominator > 0 ? 1 - dot / denominator : 1
        }
        // Vectors are checked (finite squared lengths), so this is never NaN; should one be, it is the farthest.
        return d.isNaN ? .infinity : d
    }

    /// The distance under `metric` between `a` and `b` (same length), as searches compute it: the reference the
    /// tests check searches against.
    public static func distance(_ a: [Float], _ b: [Float], _ metric: VectorMetric) -> Float {
        a.withUnsafeBufferPointer { x in
            b.withUnsafeBufferPointer { y in
                guard let p = x.baseAddress, let q = y.baseAddress else { return distance(0, 0, 0, metric) }
                let n = min(a.count, b.count)
                return rowDistance(p, q, n, dot(p, p, n), dot(q, q, n), metric)
            }
        }
    }

    /// The inner product of `a` and `b` (same length).
    public static func dot(_ a: [Float], _ b: [Float]) -> Float {
        a.withUnsafeBufferPointer { x in b.withUnsafeBufferPointer { y in dot(x.baseAddress!, y.baseAddress!, min(a.count, b.count)) } }
    }

    /// The instruction set the inner products use ("avx512", "avx2" or "sse"), chosen once for this CPU.
    public static var instructionSet: String { String(cString: blaze_dot_f32_isa()) }

    /// The inner product of `n` floats at `a` and `b`, with the CPU's widest SIMD (`CBlazeVectorKernels`).
    @inline(__always)
    static func dot(_ a: UnsafePointer<Float>, _ b: UnsafePointer<Float>, _ n: Int) -> Float {
        blaze_dot_f32(a, b, n)
    }

    /// The inner product of `n` floats at `a` and `b` in Swift: four 8-wide accumulators, then the tail (the
    /// reference the kernels are tested against).
    static func swiftDot(_ a: UnsafePointer<Float>, _ b: UnsafePointer<Float>, _ n: Int) -> Float {
        var s0 = SIMD8<Float>(), s1 = SIMD8<Float>(), s2 = SIMD8<Float>(), s3 = SIMD8<Float>()
        var i = 0
        let ra = UnsafeRawPointer(a), rb = UnsafeRawPointer(b)
        while i + 32 <= n {
            s0 += ra.loadUnaligned(fromByteOffset: i * 4, as: SIMD8<Float>.self) * rb.loadUnaligned(fromByteOffset: i * 4, as: SIMD8<Float>.self)
            s1 += ra.loadUnaligned(fromByteOffset: i * 4 + 32, as: SIMD8<Float>.self)
                * rb.loadUnaligned(fromByteOffset: i * 4 + 32, as: SIMD8<Float>.self)
            s2 += ra.loadUnaligned(fromByteOffset: i * 4 + 64, as: SIMD8<Float>.self)
                * rb.loadUnaligned(fromByteOffset: i * 4 + 64, as: SIMD8<Float>.self)
            s3 += ra.loadUnaligned(fromByteOffset: i * 4 + 96, as: SIMD8<Float>.self)
                * rb.loadUnaligned(fromByteOffset: i * 4 + 96, as: SIMD8<Float>.self)
            i += 32
        }
        while i + 8 <= n {
            s0 += ra.loadUnaligned(fromByteOffset: i * 4, as: SIMD8<Float>.self) * rb.loadUnaligned(fromByteOffset: i * 4, as: SIMD8<Float>.self)
            i += 8
        }
        var sum = ((s0 + s1) + (s2 + s3)).sum()
        while i < n {
            sum += a[i] * b[i]
            i += 1
        }
        return sum
    }
}

/// The `k` nearest hits offered so far: a max-heap on (distance, id), its root the farthest kept.
struct NearestHeap {
    let k: Int
    private(set) var items: [VectorHit] = []

    init(k: Int) {
        self.k = k
        items.reserveCapacity(min(k, 4096))
    }

    /// The farthest kept hit's distance once `k` are kept (a candidate must beat it), else infinity.
    var bound: Float { items.count < k ? .infinity : items[0].distance }

    /// Keeps `hit` if it is among the `k` nearest so far.
    mutating func offer(_ hit: VectorHit) {
        if items.count < k {
            items.append(hit)
            var c = items.count - 1
            while c > 0 {
                let p = (c - 1) / 2
                guard VectorHit.before(items[p], items[c]) else { break }
                items.swapAt(p, c)
                c = p
            }
            return
        }
        guard VectorHit.before(hit, items[0]) else { return }
        items[0] = hit
        var p = 0
        while true {
            let l = 2 * p + 1, r = l + 1
            var m = p
            if l < items.count, VectorHit.before(items[m], items[l]) { m = l }
            if r < items.count, VectorHit.before(items[m], items[r]) { m = r }
            if m == p { break }
            items.swapAt(p, m)
            p = m
        }
    }

    /// The kept hits, nearest first.
    func sorted() -> [VectorHit] { items.sorted(by: VectorHit.before) }
}

/// Exact nearest-neighbour search over rows offered one at a time and not kept: its memory is the query and the `k`
/// hits, whatever the number of rows (distances as `VectorMatrix.nearest` reports them).
public struct StreamingNearest {
    private let query: [Float]
    private let queryNorm: Float
    private let metric: VectorMetric
    private var heap: NearestHeap

    /// A search for the `k` rows nearest to `query` under `metric`.
    public init(query: [Float], k: Int, metric: VectorMetric) {
        precondition(k > 0 && !query.isEmpty)
        (self.query, self.metric, heap) = (query, metric, NearestHeap(k: k))
        queryNorm = VectorMatrix.dot(query, query)
    }

    /// Offers row `id`; a row of another length than the query is skipped.
    public mutating func offer(_ id: Int64, _ row: UnsafeBufferPointer<Float>) {
        guard row.count == query.count, let base = row.baseAddress else { return }
        if metric == .l2 {
            // From the differences, as `VectorMatrix.nearest` does (one pass, where the lengths' way takes two).
            let d = query.withUnsafeBufferPointer { q in VectorMatrix.rowDistance(base, q.baseAddress!, row.count, 0, 0, .l2) }
            heap.offer(VectorHit(id: id, distance: d))
            return
        }
        let (dot, norm) = query.withUnsafeBufferPointer { q in
            (VectorMatrix.dot(base, q.baseAddress!, row.count), VectorMatrix.dot(base, base, row.count))
        }
        heap.offer(VectorHit(id: id, distance: VectorMatrix.distance(dot, norm, queryNorm, metric)))
    }

    /// The rows kept, nearest first.
    public var hits: [VectorHit] { heap.sorted() }
}
