import BlazeProtocol

/// The handlers of the methods `blazed` serves, one per `RPCMethod`, grouped by area in `Methods+Area.swift`.
///
/// Method names, parameters and result shapes come from `Protocol/blazedb.openrpc.json` through the generated
/// `RPC.*` types; adding a method to the document makes this switch fail to compile until it has a handler.
enum Methods {
    /// The handler of `method`.
    static func handler(for method: RPCMethod) -> MethodHandler {
        switch method {
        case .rpcDiscover: return rpcDiscover
        case .daemonInfo: return daemonInfo
        case .daemonConfig: return daemonConfig
        case .daemonMetrics: return daemonMetrics
        case .dbCreate: return dbCreate
        case .dbList: return dbList
        case .dbInfo: return dbInfo
        case .dbCheck: return dbCheck
        case .dbDrop: return dbDrop
        case .dbBackup: return dbBackup
        case .dbRestore: return dbRestore
        case .dbCompact: return dbCompact
        case .collectionList: return collectionList
        case .collectionDrop: return collectionDrop
        case .docInsert: return docInsert
        case .docGet: return docGet
        case .docGetMany: return docGetMany
        case .docHistory: return docHistory
        case .docPut: return docPut
        case .docPatch: return docPatch
        case .docDelete: return docDelete
        case .txCommit: return txCommit
        case .queryFind: return queryFind
        case .queryNearest: return queryNearest
        case .queryCount: return queryCount
        case .queryExplain: return queryExplain
        case .queryAggregate: return queryAggregate
        case .queryUpdate: return queryUpdate
        case .queryDelete: return queryDelete
        case .indexCreate: return indexCreate
        case .indexDrop: return indexDrop
        case .indexList: return indexList
        case .conflictList: return conflictList
        case .conflictResolve: return conflictResolve
        case .blobPut: return blobPut
        case .blobUpload: return blobUpload
        case .blobAppend: return blobAppend
        case .blobFinish: return blobFinish
        case .blobAbort: return blobAbort
        case .blobGc: return blobGc
        case .blobRead: return blobRead
        case .blobGet: return blobGet
        case .blobStat: return blobStat
        case .blobPin: return blobPin
        case .blobUnpin: return blobUnpin
        case .blobPolicy: return blobPolicy
        case .blobList: return blobList
        case .subscribe: return subscribe
        case .unsubscribe: return unsubscribe
        case .dbShare: return dbShare
        case .dbJoin: return dbJoin
        case .dbInvite: return dbInvite
        case .dbMembers: return dbMembers
        case .dbRevoke: return dbRevoke
        case .dbRelayCapability: return dbRelayCapability
        case .peerAdd: return peerAdd
        case .peerRemove: return peerRemove
        case .peerList: return peerList
        case .folderAdd: return folderAdd
        case .folderRemove: return folderRemove
        case .folderList: return folderList
        case .syncStatus: return syncStatus
        case .syncNow: return syncNow
        case .syncPause: return syncPause
        case .syncResume: return syncResume
        }
    }
}
