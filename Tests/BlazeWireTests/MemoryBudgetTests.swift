import Testing

@testable import BlazeWire

/// `MemoryBudget`: what connections together may hold for snapshot pieces waiting for their manifests.
@Suite struct MemoryBudgetTests {
    @Test func reservationsStayWithinTheLimitAndComeBack() async {
        let budget = MemoryBudget(limit: 100)
        #expect(budget.reserve(60) && budget.reserve(40))
        #expect(!budget.reserve(1), "full")
        #expect(!budget.reserve(-5), "a negative reservation is no way around it")
        budget.release(40)
        #expect(!budget.reserve(41) && budget.reserve(40))
        budget.release(1_000)
        #expect(budget.inUse == 0, "never below nothing")
        // Many connections at once: never more than the limit granted.
        let granted = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<1_000 { group.addTask { budget.reserve(7) ? 7 : 0 } }
            return await group.reduce(0, +)
        }
        #expect(granted <= 100 && granted == budget.inUse && granted == 98)
    }

    @Test func oneKeyCannotTakeMoreThanItsShare() {
        let budget = MemoryBudget(limit: 100, perKey: 60)
        #expect(budget.reserve(60, for: "space a") && !budget.reserve(1, for: "space a"))
        #expect(budget.reserve(40, for: "space b") && !budget.reserve(1, for: "space c"), "the total still holds")
        budget.release(30, for: "space a")
        #expect(budget.reserve(30, for: "space c"))
        // Giving back more than a key holds gives back only what it holds.
        budget.release(1_000, for: "space b")
        #expect(budget.inUse == 60 && budget.reserve(40, for: "space b"))
    }
}
