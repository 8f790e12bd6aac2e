/// Why an invite was not redeemed. The raw values are the counters' names in `sync.status`.
public enum InviteRefusal: String, Error, Sendable, CaseIterable {
    /// No invite with that id was issued here, or its secret does not match.
    case unknown = "invite_unknown"
    /// The invite was redeemed before.
    case used = "invite_used"
    /// The invite's expiry has passed.
    case expired = "invite_expired"
    /// The device that issued the invite is no longer an admin.
    case inviterNotAdmin = "inviter_not_admin"
}
