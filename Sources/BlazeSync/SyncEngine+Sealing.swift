import BlazeStore
import NIOCore
import Synchronization

/// The timer of the background sealing, and whether a round is running.
final class BackgroundSealing: Sendable {
    /// The repeating timer, once started; nil again after `stop`.
    let task = Mutex<RepeatedTask?>(nil)
    /// Set while a round runs on the I/O pool: a tick that finds it set does nothing.
    let busy = Atomic<Bool>(false)
    /// Set by `stop`: no round starts after it.
    let stopped = Atomic<Bool>(false)
}

/// Background sealing: this device's changes to a shared database are sealed into entries soon after they commit, a
/// whole batch (1,000) at a time, whether or not a peer is connected (ARCHITECTURE.md, "Sync and transports").
///
/// Sessions seal what is pending before they send, so sealing here changes nothing peers see; it moves the work out
/// of reconnection. A device that wrote for a week offline comes back with its log sealed and only sends it, instead
/// of sealing every change while its peers wait. Sealing happens outside the writer (`SyncLogStore.sealPending`), so
/// local writes do not wait for it.
extension SyncEngine {
    /// How often the background sealing looks for unsealed local changes.
    static let sealInterval = TimeAmount.milliseconds(200)

    /// Starts the background sealing (once).
    func startSealing() {
        sealing.task.withLock { task in
            guard task == nil, !sealing.stopped.load(ordering: .relaxed) else { return }
            task = group.next().scheduleRepeatedTask(initialDelay: Self.sealInterval, delay: Self.sealInterval) {
                [weak self] _ in
                self?.sealRound()
            }
        }
    }

    /// Stops the background sealing; a round running stops after the batch it is sealing.
    func stopSealing() {
        sealing.stopped.store(true, ordering: .relaxed)
        sealing.task.withLock { task in
            task?.cancel()
            task = nil
        }
    }

    /// One round: on the I/O pool, seals what every shared database holds unsealed (nothing for a database whose key
    /// this device cannot seal with). A round still running when the timer fires again is not doubled.
    private func sealRound() {
        guard !sealing.stopped.load(ordering: .relaxed),
            sealing.busy.compareExchange(expected: false, desired: true, ordering: .acquiring).exchanged
        else { return }
        let spaces = served.withLock { Array($0.values) }
        let (identity, logger, sealing, store) = (self.identity, self.logger, self.sealing, self.store)
        let done = pool.runIfActive(eventLoop: group.next()) {
            for space in spaces where !sealing.stopped.load(ordering: .relaxed) && store.isCurrent(space.db) {
                do {
                    // Whole batches only: a round every 200 ms would otherwise sign a head per few entries
                    // (sessions seal the rest, with its head, before they send).
                    try space.db.sealLocal(
                        key: space.snapshot.key, identity: identity, membership: space.snapshot.membership, fullBatchesOnly: true,
                        continuing: { !sealing.stopped.load(ordering: .relaxed) })
                } catch {
                    logger.debug(
                        "Background sealing failed; sessions seal before they send",
                        metadata: ["db": "\(space.db.name)", "error": "\(error)"])
                }
            }
        }
        done.whenComplete { _ in sealing.busy.store(false, ordering: .releasing) }
    }
}
