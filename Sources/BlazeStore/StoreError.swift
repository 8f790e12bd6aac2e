import BlazeProtocol

/// An error from the store with a stable code; the daemon maps it to a JSON-RPC error in one place.
public struct StoreError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Broad class of the error; stable across releases.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Base: String {
            case notFound, alreadyExists, invalidArgument, limitExceeded, unavailable, internalFailure, syncFailure
        }
        private let base: Base
        /// Something named by the caller does not exist.
        public static let notFound = Code(base: .notFound)
        /// Something the caller wants to create already exists.
        public static let alreadyExists = Code(base: .alreadyExists)
        /// The caller's input is malformed or violates a rule.
        public static let invalidArgument = Code(base: .invalidArgument)
        /// A configured limit was exceeded.
        public static let limitExceeded = Code(base: .limitExceeded)
        /// The service is going away (shutting down); retry elsewhere or later.
        public static let unavailable = Code(base: .unavailable)
        /// A sync operation cannot proceed (the database is not shared, a key is missing, a peer refused).
        public static let syncFailure = Code(base: .syncFailure)
        /// The store failed internally (I/O, corruption, bug).
        public static let internalFailure = Code(base: .internalFailure)
        /// The code's name.
        public var description: String { base.rawValue }
    }

    /// Broad class.
    public var code: Code
    /// Stable machine-readable reason (`data.kind` on the wire), e.g. "document_not_found".
    public var kind: String
    /// What was wrong and what to do.
    public var message: String
    /// Extra structured facts (e.g. the failing op index in a transaction).
    public var details: [String: JSONValue]

    /// Creates an error.
    public init(_ code: Code, kind: String, _ message: String, details: [String: JSONValue] = [:]) {
        self.code = code
        self.kind = kind
        self.message = message
        self.details = details
    }

    /// "message (kind)".
    public var description: String { "\(message) (\(kind))" }

    static func invalid(_ kind: String, _ message: String) -> StoreError {
        StoreError(.invalidArgument, kind: kind, message)
    }
}
