#if canImport(Glibc)
import Glibc
#endif

/// Wakes a folder link's thread from any other thread (a commit, a membership change, a stop): one byte into a pipe
/// the thread polls.
final class WakeSignal: Sendable {
    private let readFD: Int32
    private let writeFD: Int32

    /// A new signal; nil when no pipe can be made (out of descriptors).
    init?() {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { return nil }
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        (readFD, writeFD) = (fds[0], fds[1])
    }

    deinit {
        close(readFD)
        close(writeFD)
    }

    /// Wakes the waiting thread (a full pipe already will).
    func wake() {
        var byte: UInt8 = 1
        _ = write(writeFD, &byte, 1)
    }

    /// The descriptor the waiting thread polls.
    var descriptor: Int32 { readFD }

    /// Empties the pipe.
    func drain() {
        var buffer = [UInt8](repeating: 0, count: 64)
        while read(readFD, &buffer, buffer.count) > 0 {}
    }
}

/// Waits until a watched directory changes (inotify on Linux), the link is woken, or a poll interval passes. Without
/// inotify (or for changes it does not see: other machines writing a network share) the interval alone paces reading.
final class FolderWatch {
    private var inotify: Int32 = -1
    /// Watched directories and the inode each had: a directory removed and made again is watched again.
    private var watched: [String: UInt64] = [:]
    let signal: WakeSignal

    /// A watch that wakes on `signal`, using inotify when `useInotify` and the system offers it.
    init(signal: WakeSignal, useInotify: Bool) {
        self.signal = signal
        #if os(Linux)
        if useInotify { inotify = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC)) }
        #endif
    }

    deinit {
        if inotify >= 0 { close(inotify) }
    }

    /// The most directories one folder link watches.
    static let maxWatches = 1_024

    /// True when inotify is in use.
    var usesInotify: Bool { inotify >= 0 }

    /// Watches `directory` for files appearing, growing, being replaced or removed (once per directory: again when
    /// the path names another directory than before).
    /// At most `maxWatches` directories are watched (the poll paces the rest): every one costs the user's inotify
    /// watches, which the system bounds (`fs.inotify.max_user_watches`) for every program the user runs.
    func watch(_ directory: String) {
        #if os(Linux)
        var st = stat()
        guard inotify >= 0, stat(directory, &st) == 0, watched[directory] != UInt64(st.st_ino) else { return }
        guard watched[directory] != nil || watched.count < Self.maxWatches else { return }
        let mask = UInt32(IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_ATTRIB)
        if inotify_add_watch(inotify, directory, mask) >= 0 { watched[directory] = UInt64(st.st_ino) }
        #endif
    }

    /// Waits up to `milliseconds`; returns once something may have changed (or the time passed).
    func wait(milliseconds: Int) {
        var fds = [pollfd(fd: signal.descriptor, events: Int16(POLLIN), revents: 0)]
        if inotify >= 0 { fds.append(pollfd(fd: inotify, events: Int16(POLLIN), revents: 0)) }
        _ = poll(&fds, nfds_t(fds.count), Int32(clamping: milliseconds))
        signal.drain()
        if inotify >= 0 {
            var buffer = [UInt8](repeating: 0, count: 16 << 10)
            while read(inotify, &buffer, buffer.count) > 0 {}
        }
    }
}
