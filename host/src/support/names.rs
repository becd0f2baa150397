//! The name rules Kubernetes uses, shared by the providers config and the grants.

/// An RFC 1123 label: lowercase letters, digits and `-`, at most 63, not starting or ending
/// with `-` (namespace, provider instance and plugin type names).
pub fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// An RFC 1123 subdomain: dot-separated labels, at most 253 (most object names, e.g. Secrets).
pub fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty() && name.len() <= 253 && name.split('.').all(is_dns_label)
}
