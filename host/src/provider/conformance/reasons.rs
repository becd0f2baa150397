//! The fixed set of check reasons (`check-target.reason` in `wit/since_v0.2.0/types.wit`). They
//! become the `Ready` reason of a ProviderHealth and a label value, so the set is closed: an
//! operator's alert on `HostKeyMismatch` must mean the same thing for every provider.

/// Every reason a provider's `check` may return, with what it means; docs/plugin-authoring.md
/// ("Check reasons") shows the same table.
pub const CHECK_REASONS: &[(&str, &str)] = &[
    (
        "Ok",
        "the target answered and is usable (the only reason of an `ok` target)",
    ),
    (
        "Unreachable",
        "no answer: DNS, TCP, TLS or transport failure, or an HTTP status saying the service is down",
    ),
    (
        "Timeout",
        "the target did not answer within the provider's deadline",
    ),
    (
        "Forbidden",
        "access refused: HTTP 403, or a capability call outside the grant (`denied`)",
    ),
    (
        "Unauthorized",
        "the credentials the host added were refused (HTTP 401)",
    ),
    ("QuotaExceeded", "a quota or capacity limit is reached"),
    ("NotFound", "the target itself does not exist"),
    ("ZoneNotFound", "a configured zone or region does not exist"),
    (
        "ApiError",
        "the API answered with an error not covered above",
    ),
    (
        "SSHHandshakeFailed",
        "the SSH handshake with a hypervisor failed",
    ),
    (
        "HostKeyMismatch",
        "a hypervisor's host key is not the one in known_hosts",
    ),
    ("AuthFailed", "SSH authentication to a hypervisor failed"),
    ("PoolNotFound", "a configured storage pool does not exist"),
    (
        "PoolInactive",
        "a configured storage pool exists but is not active",
    ),
    (
        "LibvirtError",
        "libvirt answered with an error not covered above",
    ),
];

/// Reasons the operator itself writes on a ProviderHealth (besides `Ok` and `Timeout`); a
/// provider returning one would be mistaken for the host's verdict.
pub const HOST_ONLY_REASONS: &[&str] = &["PluginError", "PluginNotLoaded"];

/// Is `reason` one of [`CHECK_REASONS`]?
pub fn is_check_reason(reason: &str) -> bool {
    CHECK_REASONS.iter().any(|(known, _)| *known == reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_camel_case_unique_and_apart_from_the_hosts() {
        let mut seen = std::collections::HashSet::new();
        for (reason, meaning) in CHECK_REASONS {
            assert!(seen.insert(*reason), "{reason} twice");
            assert!(
                reason.chars().next().unwrap().is_ascii_uppercase(),
                "{reason}"
            );
            assert!(
                reason.chars().all(|c| c.is_ascii_alphanumeric()),
                "{reason}"
            );
            assert!(!meaning.is_empty(), "{reason} has a meaning");
            assert!(!HOST_ONLY_REASONS.contains(reason), "{reason}");
        }
        assert!(is_check_reason("HostKeyMismatch"));
        assert!(!is_check_reason("hostKeyMismatch"));
        assert!(!is_check_reason("PluginError"));
    }
}
