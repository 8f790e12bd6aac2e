import BlazeCRDT
import Testing

@testable import BlazeStore

/// The per-transaction document bookkeeping keeps its lists once-only and in order, and hands them over exactly once.
@Suite struct TransactionDocumentsTests {
    let a = DocKey(collection: "c", id: "a"), b = DocKey(collection: "c", id: "b"), c = DocKey(collection: "c", id: "c")

    @Test func savedKeysAreTouchedAndDirtyOnceInFirstWriteOrder() {
        var docs = TransactionDocuments()
        #expect(docs.untouched(a))
        docs.save(b, DocumentState())
        docs.save(a, DocumentState())
        docs.save(b, DocumentState())
        #expect(!docs.untouched(a) && docs.isDirty(a) && docs.isDirty(b) && !docs.isDirty(c))
        docs.checkInvariants()
        #expect(docs.takeTouched() == [b, a])
        #expect(docs.takeTouched() == [])
        // A key saved again after its change was recorded is touched again but written once.
        docs.save(a, DocumentState())
        #expect(docs.takeTouched() == [a])
        #expect(docs.takeDirty().map(\.key) == [b, a])
        #expect(docs.takeDirty().isEmpty && !docs.isDirty(a))
        docs.checkInvariants()
    }

    @Test func fastPathKeysAreTouchedButNeverDirty() {
        var docs = TransactionDocuments()
        let stamp = Stamp(hlc: HLC(raw: 1), origin: NodeID(bytes: Array(repeating: 1, count: 16)), seq: 1, index: 0)
        docs.created[c] = .init(doc: ["_id": "c", "x": 1], text: #"{"_id":"c","x":1}"#, stamp: stamp, rowid: 7)
        docs.touch(c)
        docs.touch(c)
        #expect(!docs.untouched(c) && !docs.isDirty(c))
        #expect(docs.created[c]?.fields == ["x": 1])
        docs.checkInvariants()
        #expect(docs.takeTouched() == [c])
        #expect(docs.takeDirty().isEmpty)
    }
}
