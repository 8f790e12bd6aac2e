import NIOCore
import NIOPosix

/// The event loops that serve client connections, apart from the sync engine's loops, with how many connections each
/// one serves.
///
/// A connection alone on its loop commits its single-operation writes right there, blocking the loop through the
/// fsync as a PostgreSQL backend blocks for its client (`RPCHandler`): no hand-off to the writer's thread and back.
/// That is only harmless while nothing else uses the loop, so peer links, relay and folder work stay on the sync
/// engine's loops, and the count tells a connection whether it is alone.
struct ClientLoops: Sendable {
    /// The loops, one per core.
    let group: MultiThreadedEventLoopGroup
    private let connections: [ObjectIdentifier: NIOLoopBoundBox<Int>]

    /// Starts `threads` event loops.
    init(threads: Int) {
        group = MultiThreadedEventLoopGroup(numberOfThreads: threads)
        var counts: [ObjectIdentifier: NIOLoopBoundBox<Int>] = [:]
        for loop in group.makeIterator() {
            counts[ObjectIdentifier(loop)] = NIOLoopBoundBox.makeBoxSendingValue(0, as: Int.self, eventLoop: loop)
        }
        connections = counts
    }

    /// The count of connections served by `loop` (one of `group`'s).
    func connections(on loop: any EventLoop) -> NIOLoopBoundBox<Int> {
        connections[ObjectIdentifier(loop)]!
    }
}
