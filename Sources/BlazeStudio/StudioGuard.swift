import BlazeProtocol
import Crypto
import Foundation
import HTTPTypes
import Hummingbird

/// What every Studio request passes through: the `Host` must name a loopback address (no DNS rebinding), an `Origin`,
/// when sent, must be the Studio's own, and every response carries headers that keep the page to itself (a content
/// security policy of its own files only, no framing, no referrer, no caching). The bridge (`mayUpgrade`) also wants
/// the token and an `Origin`, which a browser always sends with a WebSocket.
struct StudioGuard<Context: RequestContext>: RouterMiddleware {
    /// The token the bridge asks for.
    let token: String

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var response: Response
        if let host = Self.host(of: request), PeerAddress.isLoopbackHostHeader(host) {
            if let origin = request.headers[.origin], origin != "http://" + host {
                response = Self.refusal(.forbidden, "Studio answers only its own pages (Origin \(origin) is not http://\(host)).")
            } else {
                do {
                    response = try await next(request, context)
                } catch let error as HTTPError {
                    response = Self.refusal(error.status, error.body ?? error.status.reasonPhrase)
                }
            }
        } else {
            response = Self.refusal(.forbidden, "Studio answers only requests addressed to 127.0.0.1, [::1] or localhost.")
        }
        // On every answer, refusals and errors too.
        response.headers[.contentSecurityPolicy] =
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
            + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        response.headers[.xContentTypeOptions] = "nosniff"
        response.headers[HTTPField.Name("X-Frame-Options")!] = "DENY"
        response.headers[HTTPField.Name("Referrer-Policy")!] = "no-referrer"
        response.headers[HTTPField.Name("Cross-Origin-Resource-Policy")!] = "same-origin"
        return response
    }

    /// True when a WebSocket upgrade to the bridge may go ahead: an `Origin` (the middleware checked it is this
    /// Studio's) and the right token in the query (`tokenMatches`).
    func mayUpgrade(_ request: Request) -> Bool {
        request.headers[.origin] != nil && tokenMatches(request)
    }

    /// True when the request's `token` query parameter is the token, compared in constant time.
    func tokenMatches(_ request: Request) -> Bool {
        guard let given = request.uri.queryParameters.get("token") else { return false }
        let a = SHA256.hash(data: Data(given.utf8)), b = SHA256.hash(data: Data(token.utf8))
        // Equal digests, compared without an early exit (swift-crypto's digests compare in constant time).
        return a == b
    }

    /// The `Host` of a request (HTTP/1's `Host` header arrives as the authority).
    static func host(of request: Request) -> String? {
        request.head.authority
    }

    /// A short plain-text refusal.
    static func refusal(_ status: HTTPResponse.Status, _ text: String) -> Response {
        Response(
            status: status, headers: [.contentType: "text/plain; charset=utf-8", .cacheControl: "no-store"],
            body: .init(byteBuffer: ByteBuffer(string: text + "\n")))
    }
}
