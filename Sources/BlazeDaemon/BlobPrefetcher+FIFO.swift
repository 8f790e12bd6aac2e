import BlazeProtocol

extension BlobPrefetcher {
    /// A first-in first-out list that takes from its head without moving the rest.
    struct FIFO {
        private var items: [ChunkID] = []
        private var head = 0
        var isEmpty: Bool { head == items.count }
        mutating func push(_ id: ChunkID) { items.append(id) }
        mutating func pop() -> ChunkID? {
            guard head < items.count else { return nil }
            defer {
                head += 1
                if head > 1024 && head * 2 > items.count {
                    items.removeFirst(head)
                    head = 0
                }
            }
            return items[head]
        }
        mutating func keep(_ wanted: (ChunkID) -> Bool) {
            items = items[head...].filter(wanted)
            head = 0
        }
        var all: ArraySlice<ChunkID> { items[head...] }
    }
}
