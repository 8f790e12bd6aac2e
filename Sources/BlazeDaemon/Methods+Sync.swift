import Foundation
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeSync

/// The sync surface: sharing, peers and sync control (Protocol/RPC.md, "Methods"; Protocol/SYNC.md §5, §8).
extension Methods {
    static func peerAddress(_ text: String) throws -> PeerAddress {
        guard let a = PeerAddress(text) else {
            throw RPCError.invalidParams(
                "address must be host:port with a port from 1 to 65535, got \(JSONValue.string(text).jsonText)",
                kind: "invalid_address")
        }
        return a
    }

    static func peerStatus(_ s: PeerStatus) -> RPCSchema.PeerStatus {
        .init(
            peer: s.peer, direction: .init(rawValue: s.direction.rawValue) ?? .inbound, connected: s.connected,
            connections: s.connections, devices: s.devices, lastDevice: s.lastDevice, lastSyncMs: s.lastSyncMs.map { Int($0) }, sentEntries: s.sentEntries,
            receivedEntries: s.receivedEntries, sentBytes: s.sentBytes, receivedBytes: s.receivedBytes,
            peerBehind: s.peerBehind, selfBehind: s.selfBehind, errors: s.errors, lastError: s.lastError,
            rejected: s.rejected.mapValues { Int($0) }, snapshotsSent: s.snapshotsSent, snapshotsInstalled: s.snapshotsInstalled,
            chunksSent: s.chunksSent, chunksReceived: s.chunksReceived, chunkBytesReceived: s.chunkBytesReceived,
            protocolVersion: s.protocolVersion, clockSkewMs: s.clockSkewMs)
    }

    static func forkEvidence(_ f: ForkEvidence) -> RPCSchema.ForkEvidence {
        .init(
            origin: f.origin.hex, seq: Int(f.seq), heldHash: hexString(f.heldHash), otherHash: hexString(f.otherHash),
            detectedAtMs: Int(f.detectedAtMs))
    }

    static func syncState(_ db: BlazeDatabase, _ ctx: RequestContext) throws -> RPC.SyncStatus.Result.Database {
        .init(
            db: db.name, space: try db.spaceID(), paused: ctx.sync.isPaused(db: db.name),
            peers: ctx.sync.status(db: db).map(peerStatus), forks: try db.forks().map(forkEvidence),
            waiting: ctx.sync.missing(db: db).map {
                .init(origin: $0.origin, upTo: Int($0.upTo), held: Int($0.held), sinceMs: Int($0.sinceMs), via: $0.via)
            }, entryFormat: try ctx.sync.entryFormat(db: db))
    }

    /// The database named `name`, or `not_shared` unless it is shared.
    static func sharedDatabase(_ name: String, _ ctx: RequestContext) throws -> BlazeDatabase {
        let db = try ctx.database(name)
        guard try ctx.sync.spaceKey(db: db) != nil else {
            throw RPCError(
                code: RPCErrorCode.syncError, kind: "not_shared",
                message: "database \(db.name) is not shared; run db.share or db.join first")
        }
        return db
    }

    static let dbShare = MethodHandler(RPC.DbShare.self) { p, ctx in
        let db = try ctx.database(p.db)
        let shared = try ctx.sync.share(db: db)
        return .init(db: db.name, space: shared.space, token: shared.token)
    }

    static let dbJoin = MethodHandler(RPC.DbJoin.self) { p, ctx in
        let db = try ctx.sync.join(token: p.token, name: p.db)
        return .init(db: db.name, space: try db.spaceID() ?? "")
    }

    /// Longest an invite may stay valid (30 days).
    static let maxInviteSeconds = 30 * 86_400

    static let dbInvite = MethodHandler(RPC.DbInvite.self) { p, ctx in
        let db = try ctx.database(p.db)
        guard let role = MemberRole(name: p.role), let wireRole = RPC.DbInvite.Result.Role(rawValue: p.role) else {
            throw RPCError.invalidParams(
                "role must be admin, writer or reader, got \(JSONValue.string(p.role).jsonText)", kind: "invalid_role")
        }
        let seconds = p.expiresIn ?? 86_400
        guard (1...maxInviteSeconds).contains(seconds) else {
            throw RPCError.invalidParams(
                "expiresIn must be from 1 to \(maxInviteSeconds) seconds, got \(seconds)", kind: "invalid_expiry")
        }
        let address = try p.address.map { try peerAddress($0).description }
        let invite = try ctx.sync.invite(db: db, role: role, expiresInMs: Int64(seconds) * 1000, address: address)
        return .init(db: db.name, token: invite.token, role: wireRole, expiresAtMs: Int(invite.expiresAtMs))
    }

    static let dbMembers = MethodHandler(RPC.DbMembers.self) { p, ctx in
        let db = try ctx.database(p.db)
        let members = try ctx.sync.members(db: db)
        return .init(
            db: db.name, epoch: Int(try ctx.sync.spaceKey(db: db)?.epoch.value ?? 0),
            members: members.map {
                // Times are the authoring admin's clock, any 64-bit value an operation carries: shown clamped.
                .init(
                    device: $0.device, role: RPCSchema.Member.Role(rawValue: $0.role) ?? .reader, addedBy: $0.addedBy,
                    addedAtMs: Int(clamping: $0.addedAtMs), removedBy: $0.removedBy,
                    removedAtMs: $0.removedAtMs.map { Int(clamping: $0) }, thisDevice: $0.isSelf)
            })
    }

    static let dbRevoke = MethodHandler(RPC.DbRevoke.self) { p, ctx in
        let db = try ctx.database(p.db)
        guard p.device.count == 32, hexBytes(p.device) != nil else {
            throw RPCError.invalidParams(
                "device must be a node id (32 hex digits), got \(JSONValue.string(p.device).jsonText)", kind: "invalid_device")
        }
        let epoch = try ctx.sync.revoke(db: db, device: p.device.lowercased())
        return .init(db: db.name, device: p.device.lowercased(), epoch: Int(epoch.value))
    }

    static let dbRelayCapability = MethodHandler(RPC.DbRelayCapability.self) { p, ctx in
        let db = try ctx.database(p.db)
        let capability = try ctx.sync.relayCapability(db: db)
        return .init(db: db.name, space: capability.space.hex, capability: capability.text)
    }

    static let peerAdd = MethodHandler(RPC.PeerAdd.self) { p, ctx in
        let db = try ctx.database(p.db)
        let a = try peerAddress(p.address)
        return .init(db: db.name, address: a.description, added: try ctx.sync.addPeer(db: db, address: a))
    }

    static let peerRemove = MethodHandler(RPC.PeerRemove.self) { p, ctx in
        let db = try ctx.database(p.db)
        let a = try peerAddress(p.address)
        return .init(db: db.name, address: a.description, removed: try ctx.sync.removePeer(db: db, address: a))
    }

    static let peerList = MethodHandler(RPC.PeerList.self, inline: true) { p, ctx in
        let db = try ctx.database(p.db)
        let live = Dictionary(ctx.sync.status(db: db).map { ($0.peer, $0) }, uniquingKeysWith: { a, _ in a })
        return .init(
            db: db.name,
            peers: try db.peers().map {
                .init(address: $0, connected: live[$0]?.connected ?? false, device: live[$0]?.lastDevice)
            })
    }

    /// A folder path as `folder.add` takes it: absolute, without `.`/`..` parts or a trailing slash; `mustExist`
    /// also wants an existing directory.
    static func folderPath(_ text: String, mustExist: Bool) throws -> String {
        guard text.hasPrefix("/"), !text.contains("\0"), text.utf8.count <= 4096 else {
            throw RPCError.invalidParams(
                "path must be an absolute path, got \(JSONValue.string(text).jsonText)", kind: "invalid_folder")
        }
        var path = (text as NSString).standardizingPath
        while path.count > 1 && path.hasSuffix("/") { path.removeLast() }
        if mustExist {
            var isDir: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDir), isDir.boolValue else {
                throw RPCError.invalidParams(
                    "path must be an existing directory, got \(JSONValue.string(text).jsonText)", kind: "invalid_folder")
            }
        }
        return path
    }

    static let folderAdd = MethodHandler(RPC.FolderAdd.self) { p, ctx in
        let db = try ctx.database(p.db)
        let path = try folderPath(p.path, mustExist: true)
        return .init(db: db.name, path: path, added: try ctx.sync.addFolder(db: db, path: path))
    }

    static let folderRemove = MethodHandler(RPC.FolderRemove.self) { p, ctx in
        let db = try ctx.database(p.db)
        let path = try folderPath(p.path, mustExist: false)
        return .init(db: db.name, path: path, removed: try ctx.sync.removeFolder(db: db, path: path))
    }

    static let folderList = MethodHandler(RPC.FolderList.self, inline: true) { p, ctx in
        let db = try ctx.database(p.db)
        return .init(
            db: db.name,
            folders: try ctx.sync.folders(db: db).map {
                .init(path: $0.path, devices: $0.devices, lastSyncMs: $0.lastSyncMs.map { Int($0) }, lastError: $0.lastError)
            })
    }

    static let syncStatus = MethodHandler(RPC.SyncStatus.self, inline: true) { p, ctx in
        let dbs: [BlazeDatabase] =
            try p.db.map { [try ctx.store.database($0)] }
            ?? ctx.store.list().compactMap { try? ctx.store.database($0) }.filter { (try? $0.spaceID()) != nil }
        return .init(
            listen: ctx.sync.listeningAddress, strangersRefused: ctx.sync.strangersRefusedCount,
            refusedOverLimit: ctx.sync.refusedOverLimitCount, databases: try dbs.map { try syncState($0, ctx) },
            invitesRefused: ctx.sync.invitesRefusedCounts)
    }

    static let syncNow = MethodHandler(RPC.SyncNow.self, inline: true) { p, ctx in
        let db = try sharedDatabase(p.db, ctx)
        ctx.sync.syncNow(db: db.name)
        return .init(db: db.name)
    }

    static let syncPause = MethodHandler(RPC.SyncPause.self, inline: true) { p, ctx in
        let db = try sharedDatabase(p.db, ctx)
        ctx.sync.pause(db: db.name)
        return .init(db: db.name)
    }

    static let syncResume = MethodHandler(RPC.SyncResume.self, inline: true) { p, ctx in
        let db = try sharedDatabase(p.db, ctx)
        ctx.sync.resume(db: db.name)
        return .init(db: db.name)
    }
}
