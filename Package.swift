// swift-tools-version:6.1
import PackageDescription

let strict: [SwiftSetting] = [
    .swiftLanguageMode(.v6),
    .enableUpcomingFeature("ExistentialAny"),
]

// Linux only: blazed uses Linux APIs (SO_PEERCRED, sd_notify's socket, RLIMIT_NOFILE) without guards.
let package = Package(
    name: "BlazeDB",
    products: [
        .executable(name: "blazed", targets: ["blazed"]),
        .executable(name: "blazectl", targets: ["blazectl"]),
        .executable(name: "blazebench", targets: ["blazebench"]),
        .executable(name: "blaze-relay", targets: ["blaze-relay"]),
        .library(name: "BlazeDaemon", targets: ["BlazeDaemon"]),
        .library(name: "BlazeClient", targets: ["BlazeClient"]),
    ],
    dependencies: [
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-extras", from: "1.35.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-crypto", from: "3.12.3"),
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-collections", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/hummingbird-project/hummingbird-websocket", from: "2.8.1"),
    ],
    targets: [
        .target(name: "BlazeProtocol", swiftSettings: strict),
        // Every setting of blazed and blaze-relay, with its default: the libraries read their defaults here.
        .target(name: "BlazeSettings", dependencies: ["BlazeProtocol"], swiftSettings: strict),
        .target(name: "BlazeFileFormat", dependencies: [.product(name: "GRDB", package: "GRDB.swift")], swiftSettings: strict),
        .target(name: "BlazeCRDT", dependencies: ["BlazeProtocol"], swiftSettings: strict),
        .target(
            name: "BlazeCrypto",
            dependencies: [
                "BlazeProtocol", .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "HeapModule", package: "swift-collections"),
            ],
            swiftSettings: strict),
        // Blobs: content-defined chunking, chunk ids and sealing, the chunk files on disk.
        .target(
            name: "BlazeBlob",
            dependencies: ["BlazeProtocol", .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: strict),
        // Vector values and nearest-neighbour search (issue #52): no storage, no I/O.
        .target(name: "BlazeVector", dependencies: ["BlazeProtocol", "CBlazeVectorKernels"], swiftSettings: strict),
        // The inner product with the widest SIMD the CPU has, chosen at run time (C: Swift cannot).
        .target(name: "CBlazeVectorKernels"),
        // SQLite's process-wide settings, made before its first database opens (C: sqlite3_config is variadic).
        .target(name: "CBlazeSQLiteConfig", linkerSettings: [.linkedLibrary("sqlite3")]),
        .target(
            name: "BlazeStore",
            dependencies: [
                "BlazeProtocol", "BlazeCRDT", "BlazeSettings", "BlazeFileFormat", "BlazeVector", "CBlazeSQLiteConfig",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"), .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
            ],
            swiftSettings: strict),
        .target(
            name: "BlazeDaemon",
            dependencies: [
                "BlazeProtocol", "BlazeStore", "BlazeCRDT", "BlazeCrypto", "BlazeSync", "BlazeConfig", "BlazeSettings", "BlazeWire", "BlazeBlob",
                "BlazeVector",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOExtras", package: "swift-nio-extras"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: strict, plugins: ["EmbedProtocolDocument"]),
        .executableTarget(name: "EmbedDocument", path: "Sources/EmbedDocument", swiftSettings: strict),
        .plugin(name: "EmbedProtocolDocument", capability: .buildTool(), dependencies: ["EmbedDocument"]),
        // The peer wire both ends compose: messages, handshake and sealed-frame handlers, WebSocket bytes, listener
        // admission. The daemon's sync engine, the relay and blazebench's simulated devices all use it.
        .target(
            name: "BlazeWire",
            dependencies: [
                "BlazeProtocol", "BlazeCRDT", "BlazeCrypto", "BlazeSettings",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
            ],
            swiftSettings: strict),
        .target(
            name: "BlazeSync",
            dependencies: [
                "BlazeProtocol", "BlazeStore", "BlazeCRDT", "BlazeCrypto", "BlazeSettings", "BlazeWire", "BlazeBlob",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict),
        .target(
            name: "BlazeRelay",
            dependencies: [
                // Blind: the wire and the crypto it checks, never the store or the sync engine of a device.
                "BlazeProtocol", "BlazeCRDT", "BlazeCrypto", "BlazeSettings", "BlazeWire", "BlazeFileFormat",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict),
        .executableTarget(
            name: "blaze-relay",
            dependencies: [
                "BlazeRelay", "BlazeCrypto", "BlazeProtocol", "BlazeConfig", "BlazeSettings", "BlazeWire", "BlazeLog",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict),
        .target(name: "BlazeClient", dependencies: ["BlazeProtocol"], swiftSettings: strict),
        // blazed's and blaze-relay's structured log lines.
        .target(
            name: "BlazeLog", dependencies: ["BlazeProtocol", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strict),
        .target(
            name: "BlazeConfig", dependencies: ["BlazeProtocol", "BlazeSettings", .product(name: "Yams", package: "Yams")],
            swiftSettings: strict),
        .executableTarget(
            name: "blazed",
            dependencies: [
                "BlazeDaemon", "BlazeConfig", "BlazeSettings", "BlazeProtocol", "BlazeLog",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict),
        .executableTarget(
            name: "blazebench",
            dependencies: [
                "BlazeDaemon", "BlazeStore", "BlazeSync", "BlazeCRDT", "BlazeCrypto", "BlazeClient", "BlazeProtocol", "BlazeRelay", "BlazeWire",
                "BlazeBlob", "BlazeVector",
                // Throwaway PostgreSQL servers for the RELAY load on PostgreSQL.
                "BlazeTestSupport",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict),
        // Studio (issue #53): the web app `blazectl studio` serves on loopback, bridged to the daemon's socket.
        .target(
            name: "BlazeStudio",
            dependencies: [
                "BlazeProtocol",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdWebSocket", package: "hummingbird-websocket"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOExtras", package: "swift-nio-extras"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            resources: [.embedInCode("Assets/index.html"), .embedInCode("Assets/studio.js"), .embedInCode("Assets/studio.css")],
            swiftSettings: strict),
        .executableTarget(
            name: "blazectl",
            dependencies: [
                "BlazeProtocol", "BlazeClient", "BlazeConfig", "BlazeSettings", "BlazeStudio",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict),
        .target(
            name: "BlazeTestSupport",
            dependencies: [.product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOEmbedded", package: "swift-nio")],
            path: "Tests/BlazeTestSupport", swiftSettings: strict),
        .testTarget(
            name: "BlazeCRDTTests", dependencies: ["BlazeCRDT", "BlazeProtocol", "BlazeTestSupport"], swiftSettings: strict),
        .testTarget(
            name: "BlazeCryptoTests",
            dependencies: ["BlazeCrypto", "BlazeProtocol", "BlazeTestSupport", .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: strict),
        .testTarget(
            name: "BlazeBlobTests", dependencies: ["BlazeBlob", "BlazeProtocol", "BlazeTestSupport"], swiftSettings: strict),
        .testTarget(
            name: "BlazeVectorTests", dependencies: ["BlazeVector", "BlazeProtocol", "BlazeTestSupport"], swiftSettings: strict),
        .testTarget(name: "BlazeProtocolTests", dependencies: ["BlazeProtocol", "BlazeTestSupport"], swiftSettings: strict),
        .testTarget(
            name: "BlazeStoreTests",
            dependencies: [
                "BlazeStore", "BlazeProtocol", "BlazeCRDT", "BlazeCrypto", "BlazeTestSupport", "BlazeVector",
                .product(name: "GRDB", package: "GRDB.swift"), .product(name: "GRDBSQLite", package: "GRDB.swift"),
            ],
            swiftSettings: strict),
        .testTarget(
            name: "BlazeWireTests",
            dependencies: [
                "BlazeWire", "BlazeCrypto", "BlazeProtocol", "BlazeTestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "BlazeSyncTests",
            dependencies: [
                "BlazeSync", "BlazeStore", "BlazeCRDT", "BlazeCrypto", "BlazeProtocol", "BlazeTestSupport", "BlazeWire",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                // The sync log, snapshot and compaction tests check the store's tables (rows, CRDT states).
                .product(name: "GRDB", package: "GRDB.swift"),
            ],
            swiftSettings: strict),
        .testTarget(
            name: "BlazeRelayTests",
            dependencies: [
                "BlazeRelay", "BlazeSync", "BlazeStore", "BlazeCRDT", "BlazeCrypto", "BlazeProtocol", "BlazeTestSupport", "BlazeWire",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOPosix", package: "swift-nio"),
                // Tests of the relay's stores upgrade databases of either kind made before a migration.
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
            ],
            swiftSettings: strict),
        .testTarget(
            name: "BlazeDaemonTests",
            dependencies: [
                "BlazeDaemon", "BlazeClient", "BlazeProtocol", "BlazeStore", "BlazeCRDT", "BlazeCrypto", "BlazeSync", "BlazeTestSupport",
                "BlazeConfig", "BlazeSettings", "BlazeRelay", "BlazeWire", "BlazeVector",
                // Not imported: the tests run these executables, so they must be built first.
                "blazed", "blazectl", "blaze-relay",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict),
    ]
)
