import BlazeProtocol
import BlazeStore
import BlazeSync

/// The sync surface: sharing, peers and sync control (Protocol/SYNC.md, "Sharing and peers").
extension Methods {
    static let address = ParamSpec.required("address", .string, "Peer address, host:port (IPv6 as [host]:port).")

    static func peerAddress(_ p: Params) throws -> PeerAddress {
        guard let a = PeerAddress(p.string("address")) else {
            throw RPCError.invalidParams(
                "address must be host:port with a port from 1 to 65535, got \(JSONValue.string(p.string("address")).jsonText)",
                kind: "invalid_address")
        }
        return a
    }

    static func peerJSON(_ s: PeerStatus) -> JSONValue {
        [
            "peer": .string(s.peer), "direction": .string(s.direction), "connected": .bool(s.connected),
            "connections": .int(Int64(s.connections)), "lastSyncMs": s.lastSyncMs.map(JSONValue.int) ?? .null,
            "sentEntries": .int(Int64(s.sentEntries)), "receivedEntries": .int(Int64(s.receivedEntries)),
            "sentBytes": .int(Int64(s.sentBytes)), "receivedBytes": .int(Int64(s.receivedBytes)),
            "peerBehind": .int(Int64(s.peerBehind)), "selfBehind": .int(Int64(s.selfBehind)),
            "errors": .int(Int64(s.errors)), "lastError": s.lastError.map(JSONValue.string) ?? .null,
            "rejected": .object(s.rejected.mapValues { .int(Int64($0)) }),
        ]
    }

    static func syncJSON(_ db: BlazeDatabase, _ ctx: RequestContext) throws -> JSONValue {
        [
            "db": .string(db.name), "space": try db.spaceID().map(JSONValue.string) ?? .null,
            "paused": .bool(ctx.sync.isPaused(db: db.name)),
            "peers": .array(ctx.sync.status(db: db).map(peerJSON)),
            "forks": .array(try db.forks().map(forkJSON)),
        ]
    }

    static func forkJSON(_ f: ForkEvidence) -> JSONValue {
        [
            "origin": .string(f.origin.hex), "seq": .int(Int64(f.seq)), "heldHash": .string(hexString(f.heldHash)),
            "otherHash": .string(hexString(f.otherHash)), "detectedAtMs": .int(f.detectedAtMs),
        ]
    }

    /// Fails with `not_shared` unless `db` is shared.
    static func requireShared(_ db: BlazeDatabase, _ ctx: RequestContext) throws {
        guard try ctx.sync.spaceKey(db: db) != nil else {
            throw RPCError(
                code: RPCErrorCode.syncError, kind: "not_shared",
                message: "database \(db.name) is not shared; run db.share or db.join first")
        }
    }

    static let syncMethods: [MethodSpec] = [
        MethodSpec(name: "db.share", summary: "Shares a database: returns the secret token another device joins with.",
            params: [.db]) { p, ctx in
            let db = try ctx.database(p)
            let token = try ctx.sync.share(db: db)
            return ["db": .string(db.name), "space": .string(try db.spaceID() ?? ""), "token": .string(token)]
        },
        MethodSpec(name: "db.join", summary: "Creates a local replica of a shared database from its secret token.",
            params: [
                .required("token", .string, "The secret token printed by db.share on another device."),
                .optional("db", .string, "Name of the new local database (default: shared-<first 8 hex digits of the space id>)."),
            ]) { p, ctx in
            let db = try ctx.sync.join(token: p.string("token"), name: p.optionalString("db"))
            return ["db": .string(db.name), "space": .string(try db.spaceID() ?? "")]
        },
        MethodSpec(name: "peer.add", summary: "Adds a peer to sync a shared database with, and connects to it.",
            params: [.db, address]) { p, ctx in
            let db = try ctx.database(p)
            let a = try peerAddress(p)
            return ["db": .string(db.name), "address": .string(a.description), "added": .bool(try ctx.sync.addPeer(db: db, address: a))]
        },
        MethodSpec(name: "peer.remove", summary: "Removes a peer of a database and closes its connection.",
            params: [.db, address]) { p, ctx in
            let db = try ctx.database(p)
            let a = try peerAddress(p)
            return [
                "db": .string(db.name), "address": .string(a.description),
                "removed": .bool(try ctx.sync.removePeer(db: db, address: a)),
            ]
        },
        MethodSpec(inline: true, name: "peer.list", summary: "Lists the peers a database syncs with.", params: [.db]) { p, ctx in
            let db = try ctx.database(p)
            let live = Dictionary(ctx.sync.status(db: db).map { ($0.peer, $0.connected) }, uniquingKeysWith: { a, _ in a })
            return [
                "db": .string(db.name),
                "peers": .array(try db.peers().map { ["address": .string($0), "connected": .bool(live[$0] ?? false)] }),
            ]
        },
        MethodSpec(inline: true, name: "sync.status", summary: "Sync state per shared database and peer: connections, progress, errors, rejections.",
            params: [.optional("db", .string, "Only this database (default: every shared database).")]) { p, ctx in
            let dbs: [BlazeDatabase] =
                try p.optionalString("db").map { [try ctx.store.database($0)] }
                ?? ctx.store.list().compactMap { try? ctx.store.database($0) }.filter { (try? $0.spaceID()) != nil }
            return [
                "listen": ctx.sync.listeningAddress.map(JSONValue.string) ?? .null,
                "strangersRefused": .int(Int64(ctx.sync.strangersRefusedCount)),
                "refusedOverLimit": .int(Int64(ctx.sync.refusedOverLimitCount)),
                "databases": .array(try dbs.map { try syncJSON($0, ctx) }),
            ]
        },
        MethodSpec(inline: true, name: "sync.now", summary: "Connects to every peer of a database now, skipping backoff waits.",
            params: [.db]) { p, ctx in
            let db = try ctx.database(p)
            try requireShared(db, ctx)
            ctx.sync.syncNow(db: db.name)
            return ["db": .string(db.name), "started": true]
        },
        MethodSpec(inline: true, name: "sync.pause", summary: "Pauses sync of a database: closes its peer connections until sync.resume.",
            params: [.db]) { p, ctx in
            let db = try ctx.database(p)
            try requireShared(db, ctx)
            ctx.sync.pause(db: db.name)
            return ["db": .string(db.name), "paused": true]
        },
        MethodSpec(inline: true, name: "sync.resume", summary: "Resumes sync of a paused database.", params: [.db]) { p, ctx in
            let db = try ctx.database(p)
            try requireShared(db, ctx)
            ctx.sync.resume(db: db.name)
            return ["db": .string(db.name), "paused": false]
        },
    ]
}
