import BlazeClient
import BlazeCrypto
import BlazeProtocol
import Foundation
import Synchronization

/// The real admin's own membership work while a fuzzer runs, on a thread of its own: each cycle it issues an invite
/// (`db.invite`), a fresh device redeems it through the real path (`JOIN`, then the admin's `add` and its keys), and
/// the admin revokes that device (`db.revoke`: a removal and a new epoch sealed to every remaining member). A cycle
/// starts a second after the last one ended, at most `cycles` times.
final class AdminWork: Sendable {
    /// A device admitted and then revoked: its node id (hex), the role its invite named, the epoch its removal started.
    struct Revoked: Sendable {
        let device: String
        let role: String
        let epoch: Int64
    }

    let revoked = Mutex<[Revoked]>([])
    /// Ids of the invites issued.
    let invites = Mutex<[[UInt8]]>([])
    /// What went wrong, per cycle.
    let failures = Mutex<[String]>([])
    private let stopping = Atomic<Bool>(false)
    private let wake = DispatchSemaphore(value: 0)
    private let done = DispatchSemaphore(value: 0)

    /// Starts the cycles on `db` of the daemon at `socket`.
    init(socket: String, db: String, cycles: Int = 40) {
        Thread { [self] in
            defer { done.signal() }
            let roles = ["reader", "writer", "admin"]
            var cycle = 0
            while !stopping.load(ordering: .relaxed) && cycle < cycles {
                do {
                    try self.cycle(socket: socket, db: db, role: roles[cycle % roles.count])
                } catch {
                    failures.withLock { $0.append("cycle \(cycle): \(error)") }
                }
                cycle += 1
                // Paces the cycles (and ends the wait at once on `stop`); nothing waits on another process here.
                _ = wake.wait(timeout: .now() + 1)
            }
        }.start()
    }

    /// Invites a fresh device with `role`, lets it join, and revokes it.
    private func cycle(socket: String, db: String, role: String) throws {
        let c = try BlazeConnection(socketPath: socket, timeoutSeconds: 60)
        guard let token = try c.call("db.invite", ["db": .string(db), "role": .string(role)])["token"]?.stringValue else {
            throw HostileError("db.invite returned no token")
        }
        let invite = try InviteToken(text: token).id
        invites.withLock { $0.append(invite) }
        let (device, _, view) = try HostileMember.admitted(token)
        device.close()
        guard view.member(device.identity.nodeID)?.role.name == role else {
            throw HostileError("the device was not admitted as \(role)")
        }
        let node = hexString(device.identity.nodeID)
        let epoch = try c.call("db.revoke", ["db": .string(db), "device": .string(node)])["epoch"]?.intValue ?? -1
        revoked.withLock { $0.append(Revoked(device: node, role: role, epoch: epoch)) }
    }

    /// Ends the cycles (the one under way finishes) and waits for the thread, at most 90 s; false if it did not end.
    func stop() -> Bool {
        stopping.store(true, ordering: .relaxed)
        wake.signal()
        return done.wait(timeout: .now() + 90) == .success
    }
}
