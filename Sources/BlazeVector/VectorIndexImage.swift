/// A matrix and the graph built over it, as flat arrays: what a local file keeps so that a restarted daemon searches
/// with the graph at once instead of building it again (`VectorIndexFile` in the store writes and reads it).
///
/// Restoring checks every part before anything searches it (counts, finite components, unique ids, each link naming a
/// node of the graph on a layer it is on, each node's layers as its slot number draws them), since a search indexes
/// arrays by these numbers without checking them.
public struct VectorIndexImage: Sendable {
    /// Components per row.
    public var dimensions: Int
    /// The metric the graph was built for.
    public var metric: VectorMetric
    /// The graph's build parameters.
    public var parameters: HNSWGraph.Parameters
    /// Each slot's id (`VectorMatrix.dead` for a removed row, kept as a routing node).
    public var ids: [Int64]
    /// The slots' components, slot after slot.
    public var values: [Float]
    /// Layer-0 links in use per graph node.
    public var count0: [UInt8]
    /// Layer-0 links, `2 × m` per graph node.
    public var links0: [Int32]
    /// The graph nodes on layers above 0, ascending.
    public var upperNodes: [Int32]
    /// Per node of `upperNodes`, per layer from 1 up, how many links it has.
    public var upperCounts: [UInt8]
    /// Those links, in the same order.
    public var upperLinks: [Int32]
    /// The node searches start from (-1: no node).
    public var entry: Int32
    /// The entry's layer.
    public var topLayer: Int

    /// The parts of `matrix` and of `graph`, which must have been built over it.
    public init(matrix: VectorMatrix, graph: HNSWGraph) {
        precondition(graph.generation == matrix.generation)
        (dimensions, metric, parameters) = (matrix.dimensions, graph.metric, graph.parameters)
        (ids, values, count0, links0, entry, topLayer) = (matrix.ids, matrix.values, graph.count0, graph.links0, graph.entry, graph.topLayer)
        upperNodes = graph.upper.keys.sorted()
        upperCounts = []
        upperLinks = []
        for node in upperNodes {
            for list in graph.upper[node] ?? [] {
                upperCounts.append(UInt8(list.count))
                upperLinks.append(contentsOf: list)
            }
        }
    }

    /// The parts as read from a file, to be checked by `restore()`.
    public init(
        dimensions: Int, metric: VectorMetric, parameters: HNSWGraph.Parameters, ids: [Int64], values: [Float],
        count0: [UInt8], links0: [Int32], upperNodes: [Int32], upperCounts: [UInt8], upperLinks: [Int32], entry: Int32,
        topLayer: Int
    ) {
        (self.dimensions, self.metric, self.parameters, self.ids, self.values) = (dimensions, metric, parameters, ids, values)
        (self.count0, self.links0, self.upperNodes, self.upperCounts, self.upperLinks) = (count0, links0, upperNodes, upperCounts, upperLinks)
        (self.entry, self.topLayer) = (entry, topLayer)
    }

    /// The matrix (a new generation) and its graph, after checking every part; throws naming the first part wrong.
    public func restore() throws(VectorImageError) -> (VectorMatrix, HNSWGraph) {
        func check(_ ok: Bool, _ what: @autoclosure () -> String) throws(VectorImageError) {
            if !ok { throw VectorImageError(what()) }
        }
        try check(dimensions >= 1 && dimensions <= VectorValue.maxDimensions, "dimensions \(dimensions)")
        try check(parameters.m >= 2 && parameters.m <= 64 && parameters.efConstruction >= 1, "graph parameters")
        try check(ids.count < Int(Int32.max) && values.count == ids.count * dimensions, "\(values.count) components for \(ids.count) slots")
        var matrix = VectorMatrix(dimensions: dimensions)
        matrix.slots.reserveCapacity(ids.count)
        for (slot, id) in ids.enumerated() where id != VectorMatrix.dead {
            try check(id >= 0 && matrix.slots.updateValue(slot, forKey: id) == nil, "slot \(slot): id \(id) negative or repeated")
        }
        matrix.ids = ids
        matrix.values = values
        matrix.squaredNorms = [Float](unsafeUninitializedCapacity: ids.count) { norms, count in
            values.withUnsafeBufferPointer { v in
                for slot in 0..<ids.count {
                    let row = v.baseAddress! + slot * dimensions
                    norms[slot] = VectorMatrix.dot(row, row, dimensions)
                }
            }
            count = ids.count
        }
        // Every component finite and every squared norm too (else distances are NaN and a search's order breaks).
        try check(matrix.squaredNorms.allSatisfy(\.isFinite), "a slot whose components are not finite")

        var graph = HNSWGraph(for: matrix, metric: metric, parameters: parameters)
        let nodes = count0.count, m0 = graph.m0
        try check(nodes <= ids.count && links0.count == nodes * m0, "\(nodes) graph nodes, \(links0.count) layer-0 links, \(ids.count) slots")
        var links = links0
        for node in 0..<nodes {
            let used = Int(count0[node])
            try check(used <= m0, "node \(node): \(used) layer-0 links")
            for i in 0..<m0 {
                let link = links[node * m0 + i]
                if i < used {
                    try check(link >= 0 && Int(link) < nodes && Int(link) != node, "node \(node): link \(link)")
                } else {
                    links[node * m0 + i] = -1
                }
            }
        }
        var upper: [Int32: [[Int32]]] = [:]
        var (countAt, linkAt, previous) = (0, 0, Int32(-1))
        for node in upperNodes {
            try check(node > previous && Int(node) < nodes, "upper node \(node)")
            previous = node
            let layers = HNSWGraph.layer(of: node, m: parameters.m)
            try check(layers > 0 && countAt + layers <= upperCounts.count, "upper node \(node): layers")
            var lists: [[Int32]] = []
            for layer in 1...layers {
                let n = Int(upperCounts[countAt])
                countAt += 1
                try check(n <= parameters.m && linkAt + n <= upperLinks.count, "upper node \(node) layer \(layer): \(n) links")
                let list = Array(upperLinks[linkAt..<linkAt + n])
                linkAt += n
                for link in list {
                    try check(
                        link >= 0 && Int(link) < nodes && link != node && HNSWGraph.layer(of: link, m: parameters.m) >= layer,
                        "upper node \(node) layer \(layer): link \(link)")
                }
                lists.append(list)
            }
            upper[node] = lists
        }
        try check(countAt == upperCounts.count && linkAt == upperLinks.count, "upper links left over")
        // Every node with layers above 0 is listed (a search steps onto them from any layer they are on).
        var highest = 0
        for node in 0..<nodes {
            let layers = HNSWGraph.layer(of: Int32(node), m: parameters.m)
            highest = max(highest, layers)
            try check(layers == 0 || upper[Int32(node)] != nil, "node \(node): its upper layers are missing")
        }
        if nodes == 0 {
            try check(entry == -1 && topLayer == 0, "entry of an empty graph")
        } else {
            try check(entry >= 0 && Int(entry) < nodes && topLayer == highest && HNSWGraph.layer(of: entry, m: parameters.m) == highest,
                "entry \(entry) is not on the top layer")
        }
        (graph.count0, graph.links0, graph.upper, graph.entry, graph.topLayer) = (count0, links, upper, entry, topLayer)
        return (matrix, graph)
    }
}

/// A stored matrix or graph that cannot be used as it is.
public struct VectorImageError: Error, Sendable, CustomStringConvertible {
    /// What is wrong.
    public let description: String

    init(_ description: String) { self.description = description }
}
