import BlazeCRDT
import BlazeProtocol
import BlazeStore
import Foundation

/// Builds the table of every method `blazed` serves.
enum Methods {
    static func all() -> [MethodSpec] {
        daemonMethods + databaseMethods + documentMethods + queryMethods + indexMethods + conflictMethods
            + subscriptionMethods + syncMethods + adminMethods
    }

    // MARK: daemon

    static let daemonMethods: [MethodSpec] = [
        MethodSpec(inline: true, name: "rpc.discover", summary: "Returns the OpenRPC description of this daemon's methods.", params: [])
        { _, _ in
            discoverDocument
        },
        MethodSpec(inline: true, name: "daemon.info", summary: "Version, process, paths, uptime and limits of the daemon.", params: [])
        { _, ctx in
            let uptime = ContinuousClock.now - ctx.startedAt
            let l = ctx.config.limits
            let s = ctx.config.storeLimits
            return [
                "version": .string(blazeVersion),
                "nodeId": .string(ctx.store.node.hex),
                "pid": .int(Int64(ProcessInfo.processInfo.processIdentifier)),
                "socket": .string(ctx.config.socketPath),
                "dataDir": .string(ctx.config.dataDirectory),
                "uptimeSeconds": .double(Double(uptime.components.seconds) + Double(uptime.components.attoseconds) / 1e18),
                "databases": .int(Int64(try ctx.store.list().count)),
                "connections": .int(Int64(ctx.connections.count)),
                "subscriptions": .int(Int64(ctx.connections.subscriptions.load(ordering: .relaxed))),
                "limits": [
                    "maxLineBytes": .int(Int64(l.maxLineBytes)), "maxDepth": .int(Int64(l.maxDepth)),
                    "maxBatch": .int(Int64(l.maxBatch)), "maxConnections": .int(Int64(l.maxConnections)),
                    "idleTimeoutSeconds": .int(Int64(l.idleTimeoutSeconds)),
                    "maxDocumentBytes": .int(Int64(s.maxDocumentBytes)),
                    "maxTransactionOps": .int(Int64(s.maxTransactionOps)),
                    "maxQueryLimit": .int(Int64(s.maxQueryLimit)),
                    "maxSubscriptionsPerConnection": .int(Int64(l.maxSubscriptionsPerConnection)),
                    "maxSubscriberBacklogBytes": .int(Int64(l.maxSubscriberBacklogBytes)),
                    "feedRetention": .int(Int64(s.feedRetention)),
                ],
            ]
        },
    ]

    // MARK: databases

    static let databaseMethods: [MethodSpec] = [
        MethodSpec(name: "db.create", summary: "Creates a database.", params: [.db]) { p, ctx in
            _ = try ctx.store.create(p.string("db"))
            return ["db": .string(p.string("db"))]
        },
        MethodSpec(inline: true, name: "db.list", summary: "Lists databases.", params: []) { _, ctx in
            ["databases": .array(try ctx.store.list().map { ["name": .string($0)] })]
        },
        MethodSpec(name: "db.info", summary: "Counts, size and path of a database.", params: [.db]) { p, ctx in
            let db = try ctx.database(p)
            let s = try db.summary()
            return [
                "name": .string(s.name), "path": .string(s.path), "collections": .int(Int64(s.collections)),
                "documents": .int(Int64(s.documents)), "sizeBytes": .int(s.sizeBytes),
                "nodeId": .string(db.node.hex), "stateHash": .string(try db.stateHash()),
                "versionVector": try db.versionVector().jsonValue,
            ]
        },
        MethodSpec(name: "db.drop", summary: "Deletes a database and all its data.", params: [.db]) { p, ctx in
            let space = try? ctx.store.database(p.string("db")).spaceID()
            try ctx.store.drop(p.string("db"))
            ctx.sync.forget(db: p.string("db"), spaceID: space ?? nil)
            return ["db": .string(p.string("db")), "dropped": true]
        },
        MethodSpec(inline: true, name: "collection.list", summary: "Lists the collections of a database with document counts.",
            params: [.db])
        { p, ctx in
            let cs = try ctx.database(p).collections()
            return ["collections": .array(cs.map { ["name": .string($0.name), "count": .int(Int64($0.count))] })]
        },
    ]

    // MARK: documents

    static let docParam = ParamSpec.required("doc", .object, "The document (a JSON object).")

    static let documentMethods: [MethodSpec] = [
        MethodSpec(name: "doc.insert", summary: "Inserts a new document; the id is generated unless doc._id is given.",
            params: [.db, .collection, docParam])
        { p, ctx in
            let r = try ctx.database(p).apply(try writeOp("insert", p.values))
            return ["id": .string(r.id)]
        },
        MethodSpec(inline: true, name: "doc.get", summary: "Fetches one document by id.", params: [.db, .collection, .id, .fields]) {
            p, ctx in
            ["doc": try ctx.database(p).get(collection: p.string("collection"), id: p.string("id"), fields: p.projection())]
        },
        MethodSpec(inline: true, name: "doc.getMany", summary: "Fetches documents by id, in order; missing ones are null.",
            params: [.db, .collection, .required("ids", .array, "Document ids."), .fields])
        { p, ctx in
            let ids = try p.strings("ids") ?? []
            let docs = try ctx.database(p).getMany(collection: p.string("collection"), ids: ids, fields: p.projection())
            return ["docs": .array(docs)]
        },
        MethodSpec(name: "doc.put", summary: "Creates or replaces the document with the given id (id or doc._id).",
            params: [.db, .collection, docParam, .optional("id", .string, "Document id (else doc._id).")])
        { p, ctx in
            let r = try ctx.database(p).apply(try writeOp("put", p.values))
            return ["id": .string(r.id), "created": .bool(r.created ?? false)]
        },
        MethodSpec(name: "doc.patch", summary: "Edits top-level fields: set, unset, counter incr, set add/remove.",
            params: [
                .db, .collection, .id, .optional("set", .object, "Fields to set (last writer wins)."),
                .optional("unset", .array, "Field names to remove."),
                .optional("incr", .object, "Counter increments: {field: number} (concurrent increments add up)."),
                .optional("add", .object, "Set additions: {field: [values]} (an observed-remove set)."),
                .optional("remove", .object, "Set removals: {field: [values]} (removes the additions seen)."),
            ])
        { p, ctx in
            let r = try ctx.database(p).apply(try writeOp("patch", p.values))
            return ["id": .string(r.id)]
        },
        MethodSpec(name: "doc.delete", summary: "Deletes a document.", params: [.db, .collection, .id]) { p, ctx in
            let r = try ctx.database(p).apply(try writeOp("delete", p.values))
            return ["id": .string(r.id), "deleted": true]
        },
        MethodSpec(name: "tx.commit", summary: "Applies many write operations atomically (all or nothing).",
            params: [.db, .required("ops", .array, "Operations: {op: insert|put|patch|delete, collection, ...}.")])
        { p, ctx in
            let ops = try p.array("ops").enumerated().map { i, v in
                guard case .object(var o) = v, case .string(let kind)? = o.removeValue(forKey: "op") else {
                    throw RPCError.invalidParams("ops[\(i)] must be an object with a string \"op\"")
                }
                do {
                    return try writeOp(kind, o, strict: true)
                } catch let e as RPCError {
                    throw RPCError(code: e.code, kind: e.kind, message: "ops[\(i)]: \(e.message)", details: ["op": .int(Int64(i))])
                }
            }
            let results = try ctx.database(p).commit(ops)
            return [
                "results": .array(
                    results.map { r in
                        var o: [String: JSONValue] = ["id": .string(r.id)]
                        if let c = r.created { o["created"] = .bool(c) }
                        return .object(o)
                    })
            ]
        },
    ]

    /// Builds a write operation from by-name members; used by the doc.* methods and by each op of tx.commit.
    static func writeOp(_ kind: String, _ o: [String: JSONValue], strict: Bool = false) throws -> WriteOp {
        let allowed: [String: Set<String>] = [
            "insert": ["collection", "doc"], "put": ["collection", "doc", "id"],
            "patch": ["collection", "id", "set", "unset", "incr", "add", "remove"], "delete": ["collection", "id"],
        ]
        guard let names = allowed[kind] else {
            throw RPCError.invalidParams("unknown op \"\(kind)\"; use insert, put, patch or delete")
        }
        if strict {
            for key in o.keys.sorted() where !names.contains(key) {
                throw RPCError.invalidParams("unknown member \"\(key)\" for op \(kind)")
            }
        }
        func str(_ key: String) throws -> String {
            guard case .string(let s)? = o[key] else {
                throw RPCError.invalidParams("\"\(key)\" must be a string" + (o[key] == nil ? " (missing)" : ""))
            }
            return s
        }
        func obj(_ key: String) throws -> [String: JSONValue] {
            guard case .object(let d)? = o[key] else {
                throw RPCError.invalidParams("\"\(key)\" must be an object" + (o[key] == nil ? " (missing)" : ""))
            }
            return d
        }
        let collection = try str("collection")
        switch kind {
        case "insert":
            return .insert(collection: collection, doc: try obj("doc"))
        case "put":
            let doc = try obj("doc")
            let id: String
            if o["id"] != nil && o["id"] != .null {
                id = try str("id")
            } else if case .string(let s)? = doc["_id"] {
                id = s
            } else {
                throw RPCError.invalidParams("doc.put needs an id: pass \"id\" or a string doc._id")
            }
            return .put(collection: collection, id: id, doc: doc)
        case "patch":
            let set = o["set"] == nil || o["set"] == .null ? [:] : try obj("set")
            var unset: [String] = []
            if let u = o["unset"], u != .null {
                let names = u.arrayValue?.compactMap(\.stringValue)
                guard let names, names.count == u.arrayValue?.count else {
                    throw RPCError.invalidParams("\"unset\" must be an array of field names")
                }
                unset = names
            }
            let incr = o["incr"] == nil || o["incr"] == .null ? [:] : try obj("incr")
            func elements(_ key: String) throws -> [String: [JSONValue]] {
                guard let v = o[key], v != .null else { return [:] }
                guard case .object(let m) = v else { throw RPCError.invalidParams("\"\(key)\" must be an object of arrays") }
                return try m.mapValues { x in
                    guard case .array(let a) = x else {
                        throw RPCError.invalidParams("\"\(key)\" values must be arrays of elements")
                    }
                    return a
                }
            }
            return .patch(
                collection: collection, id: try str("id"), set: set, unset: unset, incr: incr, add: try elements("add"),
                remove: try elements("remove"))
        default:
            return .delete(collection: collection, id: try str("id"))
        }
    }

    // MARK: queries

    static let queryParams: [ParamSpec] = [
        .db, .collection, .where,
        .optional("sort", .stringOrArray, "Sort keys: \"field\" or \"-field\" (descending), or an array of them."),
        .optional("limit", .integer, "Page size (default 100, max 10000)."),
    ]

    static func findQuery(_ p: Params, ctx: RequestContext) throws -> FindQuery {
        var q = FindQuery(
            collection: p.string("collection"), filter: try Filter.parse(p["where"]), sort: try SortKey.parse(p["sort"]),
            limit: Int(p["limit"]?.intValue ?? Int64(ctx.config.storeLimits.defaultQueryLimit)),
            fields: try p.projection())
        if let token = p.optionalString("cursor") {
            q.cursor = try QueryCursor.decode(token, for: q)
        }
        return q
    }

    static let queryMethods: [MethodSpec] = [
        MethodSpec(name: "query.find", summary: "Finds documents matching a filter, sorted, one page at a time.",
            params: queryParams + [
                .optional("cursor", .string, "Resume token from the previous page's result."), .fields,
            ])
        { p, ctx in
            let r = try ctx.database(p).find(try findQuery(p, ctx: ctx))
            return ["docs": .array(r.docs), "cursor": r.cursor.map(JSONValue.string) ?? .null]
        },
        MethodSpec(name: "query.count", summary: "Counts documents matching a filter.", params: [.db, .collection, .where]) {
            p, ctx in
            ["count": .int(Int64(try ctx.database(p).count(collection: p.string("collection"), filter: try Filter.parse(p["where"]))))]
        },
        MethodSpec(name: "query.explain", summary: "Shows the SQL and SQLite's plan for a query, and the indexes used.",
            params: queryParams)
        { p, ctx in
            let r = try ctx.database(p).explain(try findQuery(p, ctx: ctx))
            return [
                "sql": .string(r.sql), "plan": .array(r.plan.map(JSONValue.string)),
                "indexes": .array(r.indexes.map(JSONValue.string)),
            ]
        },
    ]

    // MARK: indexes

    static let indexMethods: [MethodSpec] = [
        MethodSpec(name: "index.create", summary: "Creates an index on one or more fields of a collection.",
            params: [
                .db, .collection, .required("fields", .array, "Field paths to index, in order."),
                .optional("name", .string, "Index name (default: collection.field...)."),
            ])
        { p, ctx in
            let fields = try p.strings("fields") ?? []
            let collection = p.string("collection")
            let name = p.optionalString("name")
            let info = try ctx.database(p).write { tx in
                try tx.createIndex(collection: collection, fields: fields, name: name)
            }
            return indexJSON(info)
        },
        MethodSpec(name: "index.drop", summary: "Drops an index by name.",
            params: [.db, .required("name", .string, "Index name.")])
        { p, ctx in
            let name = p.string("name")
            try ctx.database(p).write { tx in try tx.dropIndex(name: name) }
            return ["name": .string(name), "dropped": true]
        },
        MethodSpec(inline: true, name: "index.list", summary: "Lists indexes of a database or of one collection.",
            params: [.db, .optional("collection", .string, "Only this collection's indexes.")])
        { p, ctx in
            ["indexes": .array(try ctx.database(p).indexes(collection: p.optionalString("collection")).map(indexJSON))]
        },
    ]

    // MARK: conflicts

    static func writeJSON(_ w: FieldWrite) -> JSONValue {
        var o: [String: JSONValue] = [
            "origin": .string(w.stamp.dot.origin.hex), "seq": .int(Int64(w.stamp.dot.seq)),
            "hlc": .int(Int64(bitPattern: w.stamp.hlc.raw)), "time": .int(Int64(w.stamp.hlc.milliseconds)),
            "unset": .bool(w.value == nil),
        ]
        if let v = w.value { o["value"] = v }
        return .object(o)
    }

    static let conflictMethods: [MethodSpec] = [
        MethodSpec(inline: true, name: "conflict.list", summary: "Lists fields where a concurrent write lost, with both sides.",
            params: [
                .db, .optional("collection", .string, "Only this collection."), .optional("id", .string, "Only this document."),
                .optional("limit", .integer, "At most this many documents (default 1000)."),
            ])
        { p, ctx in
            let limit = Int(p["limit"]?.intValue ?? 1000)
            guard limit >= 1 && limit <= 10_000 else {
                throw RPCError(code: RPCErrorCode.limitExceeded, kind: "limit_out_of_range", message: "limit must be 1...10000")
            }
            let list = try ctx.database(p).conflicts(collection: p.optionalString("collection"), id: p.optionalString("id"), limit: limit)
            return [
                "conflicts": .array(
                    list.map { c in
                        var o: [String: JSONValue] = [
                            "collection": .string(c.collection), "id": .string(c.id), "field": .string(c.field),
                            "losers": .array(c.losers.map(writeJSON)), "present": .bool(c.value != nil),
                        ]
                        if let v = c.value { o["value"] = v }
                        if let w = c.winner { o["winner"] = writeJSON(w) }
                        return .object(o)
                    })
            ]
        },
        MethodSpec(name: "conflict.resolve",
            summary: "Resolves a field's conflict by writing value (or keeping the current value); replicates.",
            params: [
                .db, .collection, .id, .required("field", .string, "The conflicted field."),
                .optional("value", .any, "The value to keep; omitted keeps the current value."),
            ])
        { p, ctx in
            let db = try ctx.database(p)
            let (collection, id, field) = (p.string("collection"), p.string("id"), p.string("field"))
            let explicit = p.values["value"]
            let existing = try db.conflicts(collection: collection, id: id).first { $0.field == field }
            guard let conflict = existing else {
                throw RPCError(code: RPCErrorCode.notFound, kind: "conflict_not_found",
                    message: "field \"\(field)\" of \(collection)/\(id) has no conflict")
            }
            let value = explicit ?? conflict.value
            let op: WriteOp = value.map { .patch(collection: collection, id: id, set: [field: $0]) }
                ?? .patch(collection: collection, id: id, unset: [field])
            _ = try db.apply(op)
            return ["id": .string(id), "field": .string(field), "value": value ?? .null, "present": .bool(value != nil)]
        },
    ]

    static func indexJSON(_ info: IndexInfo) -> JSONValue {
        [
            "name": .string(info.name), "collection": .string(info.collection),
            "fields": .array(info.fields.map(JSONValue.string)),
        ]
    }

    // MARK: discovery

    /// The protocol document (Protocol/blazedb.openrpc.json, embedded by the code generator).
    static let discoverDocument: JSONValue = {
        // The generator checks the document parses; a failure here is a build defect, not a runtime condition.
        try! JSONParser(maxDepth: 256).parse(openRPCDocumentText)
    }()

    // MARK: subscriptions

    static let subscriptionMethods: [MethodSpec] = [
        MethodSpec(
            inline: true, name: "subscribe",
            summary: "Reports changes as `subscription` notifications; with `where`, a live query (enter/leave).",
            params: [
                .db, .optional("collection", .string, "Only this collection's documents (default: all)."), .where,
                .optional("since", .integer, "Replay the changes after this feed sequence first (default: only new ones)."),
            ])
        { p, ctx in
            guard let connection = ctx.connection else { throw RPCError.internalError() }
            let db = try ctx.database(p)
            let collection = p.optionalString("collection")
            if let collection { try Names.validateCollection(collection) }
            let filter = try p["where"].map { try Filter.parse($0) }
            let start: Int64
            if let since = p["since"]?.intValue {
                guard since >= 0 else { throw RPCError.invalidParams("since must be 0 or more, got \(since)") }
                try db.checkFeedPosition(since)
                start = since
            } else {
                start = db.feed.lastSequence
            }
            let sub = Subscription(database: db, collection: collection, filter: filter, start: start)
            try connection.add(sub)
            return ["subscription": .string(sub.id), "seq": .int(start)]
        },
        MethodSpec(
            inline: true, name: "unsubscribe", summary: "Ends a subscription of this connection.",
            params: [.required("subscription", .string, "The id `subscribe` returned.")])
        { p, ctx in
            let id = p.string("subscription")
            guard let connection = ctx.connection, connection.remove(id) != nil else {
                throw RPCError(
                    code: RPCErrorCode.notFound, kind: "subscription_not_found",
                    message: "this connection has no subscription \"\(id)\"")
            }
            return ["subscription": .string(id), "unsubscribed": true]
        },
    ]
}
