import BlazeSync
import NIOHTTP1

/// Who a connection counts for in the listener limits (Protocol/RELAY.md, "Limits"): its source address (an IPv6
/// one by its /64), or, behind a trusted proxy, the client the proxy names.
extension RelayServer {
    /// Admits a new connection counted for `address` (nil: a trusted proxy's, counted in the totals only for now)
    /// within the handshake rate and the gate's limits; false, and counted, when over one.
    func admit(address: String?) -> Bool {
        if let address, !handshakeRate.allow(address) {
            metrics.connectionsRefusedRate.increment()
            logger.debug("Relay refused a connection over its rate", metadata: ["address": "\(address)"])
            return false
        }
        guard gate.admit(address: address) else {
            metrics.connectionsRefusedOverLimit.increment()
            logger.debug("Relay refused a connection over its limits", metadata: ["address": "\(address ?? "a trusted proxy")"])
            return false
        }
        return true
    }

    /// Counts a trusted proxy's connection for `client` from now on, within its handshake rate and its connections;
    /// false, and counted, when over either.
    func admit(forwarded client: String, place: GatePlace) -> Bool {
        guard handshakeRate.allow(client) else {
            metrics.connectionsRefusedRate.increment()
            logger.debug("Relay refused a forwarded connection over its rate", metadata: ["client": "\(client)"])
            return false
        }
        guard place.rebind(to: client) else {
            metrics.connectionsRefusedOverLimit.increment()
            logger.debug("Relay refused a forwarded connection over its limits", metadata: ["client": "\(client)"])
            return false
        }
        return true
    }

    /// The client a trusted `proxy` forwards a request for: the last address of its `X-Forwarded-For` that is not
    /// itself a trusted proxy (the entries before it are the client's own word), counted by `SourceAddress.bucket`.
    /// Without the header, or when that entry is not an address, the proxy itself (so all such requests share the
    /// proxy's limits, as without `--trusted-proxy`).
    func forwardedClient(_ headers: HTTPHeaders, proxy: String) -> String {
        let hops = headers["X-Forwarded-For"].flatMap { $0.split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces) }
        for hop in hops.reversed() {
            guard SourceAddress.bytes(hop) != nil else { break }
            if trustedProxies.contains(where: { $0.contains(hop) }) { continue }
            return SourceAddress.bucket(hop)
        }
        return SourceAddress.bucket(proxy)
    }
}
