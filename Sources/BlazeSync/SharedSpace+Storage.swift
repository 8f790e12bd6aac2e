import BlazeCrypto
import BlazeStore

extension BlazeDatabase {
    /// Stores verified membership operations by hash; returns how many were new (`MembershipStore.add`).
    @discardableResult
    func addMembershipOps(_ ops: [MembershipOp]) throws -> Int {
        try addMembershipOps(ops.map { ($0.hash.bytes, $0.bytes) })
    }
}
