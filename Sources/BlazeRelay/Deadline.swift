import Synchronization

/// Runs `work` in a task of its own and returns its result, or throws a `RelayError` naming `what` once `limit` passes
/// first. The work is then cancelled and left to end on its own: what it waits on (a PostgreSQL query lost with its
/// connection) may never answer, and the caller must not wait with it. Cancelling the caller cancels the work.
///
/// The work and its timer run on `executor` (the relay's event loops), not on the shared concurrency pool: were that
/// pool's few threads blocked for a while (a busy embedding process), both would run late together and the timer could
/// win a race the work had already won.
func withDeadline<T: Sendable>(
    _ limit: Duration, _ what: String, executor: any TaskExecutor, _ work: @escaping @Sendable () async throws -> T
) async throws -> T {
    let race = DeadlineRace<T>()
    return try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            race.begin(continuation)
            race.start(
                worker: Task(executorPreference: executor) {
                    let result: Result<T, any Error>
                    do { result = .success(try await work()) } catch { result = .failure(error) }
                    race.finish(result)
                },
                timer: Task(executorPreference: executor) {
                    // Cancelled when the work finishes first.
                    guard (try? await Task.sleep(for: limit)) != nil else { return }
                    race.finish(.failure(RelayError("\(what) did not finish within \(limit)")))
                })
        }
    } onCancel: {
        race.finish(.failure(CancellationError()))
    }
}

/// The state `withDeadline` shares between its work, its timer and its caller: whichever finishes first resumes the
/// caller, once, and cancels the other two tasks.
private final class DeadlineRace<T: Sendable>: Sendable {
    private struct State {
        var continuation: CheckedContinuation<T, any Error>?
        var early: Result<T, any Error>?
        var worker: Task<Void, Never>?
        var timer: Task<Void, Never>?
        var done = false
    }
    private let state = Mutex(State())

    func begin(_ continuation: CheckedContinuation<T, any Error>) {
        let early = state.withLock { s -> Result<T, any Error>? in
            if s.done, let e = s.early { return e }
            s.continuation = continuation
            return nil
        }
        // Cancelled before it began.
        if let early { continuation.resume(with: early) }
    }

    func start(worker: Task<Void, Never>, timer: Task<Void, Never>) {
        let finished = state.withLock { s -> Bool in
            s.worker = worker
            s.timer = timer
            return s.done
        }
        if finished {
            worker.cancel()
            timer.cancel()
        }
    }

    func finish(_ result: Result<T, any Error>) {
        let (continuation, worker, timer) = state.withLock { s -> (CheckedContinuation<T, any Error>?, Task<Void, Never>?, Task<Void, Never>?) in
            guard !s.done else { return (nil, nil, nil) }
            s.done = true
            if s.continuation == nil { s.early = result }
            defer { s.continuation = nil }
            return (s.continuation, s.worker, s.timer)
        }
        worker?.cancel()
        timer?.cancel()
        continuation?.resume(with: result)
    }
}
