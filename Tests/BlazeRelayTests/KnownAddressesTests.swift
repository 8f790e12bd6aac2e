import Testing

@testable import BlazeRelay

/// Places kept for members (Protocol/RELAY.md, "Places kept for members"): the addresses listed devices came from,
/// bounded in all and per device, oldest forgotten first; and the reserved places one device holds.
@Suite struct KnownAddressesTests {
    @Test func oneDeviceCannotPushTheOthersOutAndTheOldestGoesFirst() {
        let known = KnownAddresses(capacity: 4, perDevice: 2)
        let x: [UInt8] = [1], y: [UInt8] = [2], z: [UInt8] = [3]
        known.remember("y1", device: y)
        // X handshaking from ever more addresses keeps only its two newest: Y's stays.
        for i in 0..<100 { known.remember("x\(i)", device: x) }
        #expect(known.contains("y1") && known.contains("x98") && known.contains("x99") && !known.contains("x97"))
        #expect(known.count == 3)
        // Full: the address remembered longest ago goes first.
        known.remember("z1", device: z)
        known.remember("z2", device: z)
        #expect(known.count == 4 && !known.contains("y1") && known.contains("z1") && known.contains("z2"))
        // Seeing an address again keeps it known.
        known.remember("x99", device: x)
        #expect(known.contains("x99") && !known.contains("unknown"))
    }

    @Test func oneDeviceHoldsAtMostItsShareOfTheReservedPlaces() {
        let places = DevicePlaces(limit: 2)
        let x: [UInt8] = [1], y: [UInt8] = [2]
        #expect(places.take(x) && places.take(x))
        #expect(!places.take(x), "a third connection of X counts as unlisted")
        #expect(places.take(y), "another device is not held back")
        places.give(x)
        #expect(places.count(x) == 1 && places.take(x))
        places.give(y)
        places.give(y)
        #expect(places.count(y) == 0, "never below zero")
    }
}
