import BlazeCrypto
import BlazeStore
import Foundation

/// The signed statements a folder carries besides entries: each writer's acknowledgements (`acks`, SYNC.md §11) and
/// statements of entry formats (`.formats`, SYNC.md §6), written into its own directory and read from the others'.
extension FolderWorker {
    /// Rewrites the acks file when the acknowledgements held changed (this device's own is issued first when what it
    /// applied changed), at most once a second: members that meet only through the folder learn what each other
    /// holds, so their compaction proceeds (SYNC.md §11). Only in spaces with a log: elsewhere nothing is stable.
    func writeAcks(_ snapshot: SharedSpace.Snapshot) throws {
        guard let membership = snapshot.membership else { return }
        guard acksWritten == nil || !exists(at: ownFD, "acks") || uptimeMs() >= acksWrittenAt + 1000 else { return }
        let lacking = engine.lackingKeys(snapshot)
        if try db.issueAcknowledgement(space: space.id, identity: engine.identity, nowMs: UInt64(max(0, nowMs())), lacking: lacking) {
            engine.membershipChanged(db: db.name)
        }
        let held = try db.acknowledgements().filter { membership.member($0.node) != nil }
        let written = Dictionary(held.map { ($0.node, $0.issuedMs) }, uniquingKeysWith: max)
        guard written != acksWritten || !exists(at: ownFD, "acks") else { return }
        try replaceFile(at: ownFD, "acks", with: FolderFiles.acks(space: space.id, acks: held.map(\.bytes)))
        acksWritten = written
        acksWrittenAt = uptimeMs()
    }

    /// Rewrites the statements file (`.formats`) when the statements of entry formats held changed (this device's own
    /// is issued first when none says what this build opens): members that meet only through the folder learn which
    /// formats each other opens (SYNC.md §6, "Entry formats"). Only in spaces with a log.
    func writeFormats(_ snapshot: SharedSpace.Snapshot) throws {
        guard let membership = snapshot.membership else { return }
        let name = FolderFiles.formatsName
        try engine.issueFormatStatement(db: db, space: space)
        let held = try db.heldFormatStatements(membership: membership)
        let written = Dictionary(held.map { ($0.node, $0.issuedMs) }, uniquingKeysWith: max)
        guard written != formatsWritten || !exists(at: ownFD, name) else { return }
        try replaceFile(at: ownFD, name, with: FolderFiles.formats(space: space.id, statements: held.map(\.bytes)))
        formatsWritten = written
    }

    /// Keeps the acknowledgements other writers' acks files hold (of members the log lists; SYNC.md §11), and lets
    /// the database's sessions pass on and compaction use those newer than the ones held.
    func readAcks() throws {
        guard let membership = space.snapshot.membership else { return }
        var kept = false
        for bytes in try changedFiles("acks") {
            do {
                let acks = try FolderFiles.decodeAcks(bytes, space: space.id).compactMap { try? Acknowledgement(bytes: $0) }
                if try db.keep(acks, space: space.id, membership: membership) { kept = true }
                if try engine.resealLacking(space: space, acks: acks) { kept = true }
            } catch let rejection as SyncRejection {
                report.reject(rejection)
            }
        }
        if kept { engine.membershipChanged(db: db.name) }
    }

    /// Keeps the statements of entry formats other writers' statements files hold (of members the log lists; SYNC.md
    /// §6, "Entry formats"), and lets the database's sessions pass on those newer than the ones held.
    func readFormats() throws {
        guard let membership = space.snapshot.membership else { return }
        var kept = false
        for bytes in try changedFiles(FolderFiles.formatsName) {
            do {
                // Read by their shape; `keep` checks each signature once it knows the signer is a member.
                let statements = try FolderFiles.decodeFormats(bytes, space: space.id).compactMap { try? FormatStatement(unverified: $0) }
                if try db.keep(statements, space: space.id, membership: membership) { kept = true }
            } catch let rejection as SyncRejection {
                report.reject(rejection)
            }
        }
        if kept { engine.membershipChanged(db: db.name) }
    }
}
