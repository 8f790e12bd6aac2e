/// An approximate nearest-neighbour index over the slots of a `VectorMatrix`: a hierarchical navigable small-world
/// graph (layers of neighbour lists, each node on layer 0 and, with probability 1/M per layer, on the layers above;
/// neighbours chosen by the diversity heuristic; a search descends greedily from the top layer and explores layer 0
/// with a candidate list of `ef`).
///
/// The graph holds links only: the vectors stay in the matrix, so the index adds about `4 × 2M` bytes per row. It is
/// built for one matrix generation and one metric; rows removed from the matrix stay in the graph as routing nodes
/// and are never returned. Nodes are added in slot order (`extend(to:)`), so a graph built over a snapshot of the
/// matrix is brought up to date by adding the slots appended since.
public struct HNSWGraph: Sendable {
    /// The build parameters.
    public struct Parameters: Sendable, Equatable {
        /// Links per node on the layers above 0 (2M on layer 0).
        public var m: Int
        /// The candidate list while inserting.
        public var efConstruction: Int

        /// M = 16, efConstruction = 200 (hnswlib's and FAISS's usual choice).
        public init(m: Int = 16, efConstruction: Int = 200) {
            self.m = m
            self.efConstruction = efConstruction
        }
    }

    /// The build parameters.
    public let parameters: Parameters
    /// The metric distances are measured in.
    public let metric: VectorMetric
    /// The matrix generation the slots belong to.
    public let generation: UInt64
    let m0: Int
    /// Layer-0 links: `m0` per node, the first `count0[node]` used.
    var links0: [Int32] = []
    var count0: [UInt8] = []
    /// The links of the layers above 0, by node: `upper[node][layer - 1]`.
    var upper: [Int32: [[Int32]]] = [:]
    var entry: Int32 = -1
    var topLayer = 0

    /// An empty graph for the slots of `matrix`'s current generation.
    public init(for matrix: VectorMatrix, metric: VectorMetric, parameters: Parameters = Parameters()) {
        precondition(parameters.m >= 2 && parameters.m <= 64 && parameters.efConstruction >= 1)
        self.parameters = parameters
        self.metric = metric
        generation = matrix.generation
        m0 = 2 * parameters.m
    }

    /// Slots added so far (0..<nodes).
    public var nodes: Int { count0.count }

    /// Bytes the links take.
    public var bytes: Int {
        links0.capacity * 4 + count0.capacity + upper.values.reduce(0) { $0 + $1.reduce(16) { $0 + $1.capacity * 4 } }
    }

    /// Adds the slots from `nodes` up to `slots` of `matrix` (which must be of the graph's generation).
    public mutating func extend(to slots: Int, in matrix: VectorMatrix) {
        precondition(matrix.generation == generation && slots <= matrix.slotCount)
        links0.reserveCapacity(slots * m0)
        count0.reserveCapacity(slots)
        matrix.values.withUnsafeBufferPointer { values in
            let space = Space(values: values.baseAddress!, norms: matrix.squaredNorms, dimensions: matrix.dimensions, metric: metric)
            while nodes < slots { insert(Int32(nodes), space) }
        }
    }

    /// The `k` live rows nearest to `query` found with a candidate list of `ef` (at least `k`), nearest first, among
    /// those `admits` lets through (all when nil); `matrix` is the one the graph was built over (rows it holds in
    /// slots the graph has not reached yet are searched exactly).
    public func nearest(
        to query: [Float], k: Int, ef: Int, in matrix: VectorMatrix, admits: ((Int64) -> Bool)? = nil
    ) -> [VectorHit] {
        guard query.count == matrix.dimensions, k > 0, matrix.generation == generation, entry >= 0, nodes <= matrix.slotCount else {
            return matrix.nearest(to: query, k: k, metric: metric, admits: admits)
        }
        let ids = matrix.ids
        var heap = NearestHeap(k: k)
        matrix.values.withUnsafeBufferPointer { values in
            query.withUnsafeBufferPointer { q in
                let space = Space(values: values.baseAddress!, norms: matrix.squaredNorms, dimensions: matrix.dimensions, metric: metric)
                let probe = Probe(vector: q.baseAddress!, norm: VectorMatrix.dot(q.baseAddress!, q.baseAddress!, query.count))
                var current = entry
                var currentDistance = space.distance(probe, current)
                for layer in stride(from: topLayer, to: 0, by: -1) {
                    (current, currentDistance) = greedy(probe, from: current, currentDistance, layer: layer, space)
                }
                let found = searchLayer(probe, from: [(currentDistance, current)], ef: max(ef, k), layer: 0, space) { node in
                    let id = ids[Int(node)]
                    return id != VectorMatrix.dead && (admits?(id) ?? true)
                }
                for (d, node) in found { heap.offer(VectorHit(id: ids[Int(node)], distance: d)) }
                // Rows in slots the graph has not reached yet.
                for slot in nodes..<ids.count where ids[slot] != VectorMatrix.dead && (admits?(ids[slot]) ?? true) {
                    heap.offer(VectorHit(id: ids[slot], distance: space.distance(probe, Int32(slot))))
                }
            }
        }
        return matrix.exact(heap.sorted(), query: query, metric: metric)
    }

    // MARK: Building

    private mutating func insert(_ node: Int32, _ space: Space) {
        let layer = Self.layer(of: node, m: parameters.m)
        links0.append(contentsOf: repeatElement(-1, count: m0))
        count0.append(0)
        if layer > 0 { upper[node] = Array(repeating: [], count: layer) }
        guard entry >= 0 else {
            (entry, topLayer) = (node, layer)
            return
        }
        let probe = space.probe(node)
        var current = entry
        var currentDistance = space.distance(probe, current)
        for l in stride(from: topLayer, to: layer, by: -1) {
            (current, currentDistance) = greedy(probe, from: current, currentDistance, layer: l, space)
        }
        var entries = [(currentDistance, current)]
        for l in stride(from: min(layer, topLayer), through: 0, by: -1) {
            let found = searchLayer(probe, from: entries, ef: parameters.efConstruction, layer: l, space) { $0 != node }
            let chosen = select(found, limit: parameters.m, space)
            setLinks(node, layer: l, chosen.map(\.1))
            for (_, neighbour) in chosen { link(neighbour, to: node, layer: l, space) }
            entries = found.isEmpty ? entries : found
        }
        if layer > topLayer { (entry, topLayer) = (node, layer) }
    }

    /// A node's layer: each layer above 0 with probability 1/M, drawn from the slot number (a rebuild draws the same).
    static func layer(of node: Int32, m: Int) -> Int {
        var state = UInt64(UInt32(bitPattern: node)) &+ 0x5DEE_CE66_D1CE_4E5B
        var layer = 0
        while layer < 16 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            z ^= z >> 31
            guard z % UInt64(m) == 0 else { break }
            layer += 1
        }
        return layer
    }

    /// The neighbours kept for a node from `candidates` (nearest first): a candidate is kept when it is nearer to the
    /// node than to every one kept before it (so the links point in different directions), up to `limit`.
    private func select(_ candidates: [(Float, Int32)], limit: Int, _ space: Space) -> [(Float, Int32)] {
        guard candidates.count > limit else { return candidates }
        var kept: [(Float, Int32)] = []
        kept.reserveCapacity(limit)
        for (d, c) in candidates {
            if kept.count == limit { break }
            let probe = space.probe(c)
            if kept.allSatisfy({ space.distance(probe, $0.1) >= d }) { kept.append((d, c)) }
        }
        return kept
    }

    private func links(_ node: Int32, layer: Int) -> ArraySlice<Int32> {
        if layer == 0 {
            let start = Int(node) * m0
            return links0[start..<(start + Int(count0[Int(node)]))]
        }
        return upper[node]?[layer - 1][...] ?? []
    }

    private mutating func setLinks(_ node: Int32, layer: Int, _ neighbours: [Int32]) {
        if layer == 0 {
            let start = Int(node) * m0
            for (i, n) in neighbours.prefix(m0).enumerated() { links0[start + i] = n }
            count0[Int(node)] = UInt8(min(neighbours.count, m0))
        } else {
            upper[node]![layer - 1] = neighbours
        }
    }

    /// A copy of `node`'s links on `layer` (a slice of `links0` held while `links0` changes would copy all of it).
    private func copyOfLinks(_ node: Int32, layer: Int) -> [Int32] {
        guard layer == 0 else { return upper[node]?[layer - 1] ?? [] }
        let start = Int(node) * m0, count = Int(count0[Int(node)])
        return links0.withUnsafeBufferPointer { Array($0[start..<(start + count)]) }
    }

    /// Adds a link from `node` to `new` on `layer`, choosing again among its links when it has its most.
    private mutating func link(_ node: Int32, to new: Int32, layer: Int, _ space: Space) {
        let limit = layer == 0 ? m0 : parameters.m
        var current = copyOfLinks(node, layer: layer)
        current.append(new)
        if current.count <= limit {
            if layer == 0 {
                links0[Int(node) * m0 + current.count - 1] = new
                count0[Int(node)] = UInt8(current.count)
            } else {
                upper[node]![layer - 1] = current
            }
            return
        }
        let probe = space.probe(node)
        let candidates = current.map { (space.distance(probe, $0), $0) }.sorted { $0.0 < $1.0 }
        setLinks(node, layer: layer, select(candidates, limit: limit, space).map(\.1))
    }

    // MARK: Searching

    /// Moves from `start` to its nearest neighbour on `layer` while that is nearer to `probe`.
    private func greedy(_ probe: Probe, from start: Int32, _ startDistance: Float, layer: Int, _ space: Space) -> (Int32, Float) {
        var (current, distance) = (start, startDistance)
        var moved = true
        while moved {
            moved = false
            for n in links(current, layer: layer) {
                let d = space.distance(probe, n)
                if d < distance { (current, distance, moved) = (n, d, true) }
            }
        }
        return (current, distance)
    }

    /// The `ef` nodes nearest to `probe` on `layer` that `accepts` lets through, nearest first, found by best-first
    /// exploration from `entries` (every node is explored, accepted or not).
    private func searchLayer(
        _ probe: Probe, from entries: [(Float, Int32)], ef: Int, layer: Int, _ space: Space, accepts: (Int32) -> Bool
    ) -> [(Float, Int32)] {
        var visited = [UInt64](repeating: 0, count: (space.slots + 63) / 64)
        func visit(_ n: Int32) -> Bool {
            let (word, bit) = (Int(n) >> 6, UInt64(1) << UInt64(n & 63))
            if visited[word] & bit != 0 { return false }
            visited[word] |= bit
            return true
        }
        var candidates = PairHeap(max: false)
        var found = PairHeap(max: true)
        for (d, n) in entries where visit(n) {
            candidates.push(d, n)
            if accepts(n) { found.push(d, n) }
        }
        while let (d, c) = candidates.pop() {
            if found.count >= ef, let worst = found.top, d > worst.0 { break }
            for n in links(c, layer: layer) where visit(n) {
                let dn = space.distance(probe, n)
                if found.count < ef || dn < (found.top?.0 ?? .infinity) {
                    candidates.push(dn, n)
                    if accepts(n) {
                        found.push(dn, n)
                        if found.count > ef { _ = found.pop() }
                    }
                }
            }
        }
        return found.items.sorted { $0.0 < $1.0 }
    }
}

/// A vector being placed or searched for, with its squared norm.
private struct Probe {
    let vector: UnsafePointer<Float>
    let norm: Float
}

/// The matrix's slots as the graph measures them.
private struct Space {
    let values: UnsafePointer<Float>
    let norms: [Float]
    let dimensions: Int
    let metric: VectorMetric

    var slots: Int { norms.count }

    func probe(_ node: Int32) -> Probe {
        Probe(vector: values + Int(node) * dimensions, norm: norms[Int(node)])
    }

    func distance(_ p: Probe, _ node: Int32) -> Float {
        let dot = VectorMatrix.dot(p.vector, values + Int(node) * dimensions, dimensions)
        return VectorMatrix.distance(dot, p.norm, norms[Int(node)], metric)
    }
}

/// A binary heap of (distance, node): the smallest on top, or the largest with `max`.
struct PairHeap {
    private(set) var items: [(Float, Int32)] = []
    let max: Bool

    init(max: Bool) { self.max = max }

    var count: Int { items.count }
    var top: (Float, Int32)? { items.first }

    @inline(__always) private func above(_ a: Int, _ b: Int) -> Bool {
        max ? items[a].0 > items[b].0 : items[a].0 < items[b].0
    }

    mutating func push(_ d: Float, _ n: Int32) {
        items.append((d, n))
        var c = items.count - 1
        while c > 0 {
            let p = (c - 1) / 2
            guard above(c, p) else { break }
            items.swapAt(c, p)
            c = p
        }
    }

    mutating func pop() -> (Float, Int32)? {
        guard let first = items.first else { return nil }
        let last = items.removeLast()
        guard !items.isEmpty else { return first }
        items[0] = last
        var p = 0
        while true {
            let l = 2 * p + 1, r = l + 1
            var best = p
            if l < items.count, above(l, best) { best = l }
            if r < items.count, above(r, best) { best = r }
            if best == p { break }
            items.swapAt(p, best)
            p = best
        }
        return first
    }
}
