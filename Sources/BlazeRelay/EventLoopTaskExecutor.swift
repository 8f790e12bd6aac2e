import NIOCore

/// Runs the relay's tasks (storage calls, re-reads, the notification watcher) on its own event loops rather than on
/// the process's shared concurrency pool: a relay embedded in a busy process (tests, `blazebench`) makes progress even
/// while that pool's few threads are blocked, and in `blaze-relay` its work stays on the threads that serve devices.
final class EventLoopTaskExecutor: TaskExecutor {
    private let group: any EventLoopGroup

    init(group: any EventLoopGroup) { self.group = group }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        group.next().execute { job.runSynchronously(on: executor) }
    }
}
