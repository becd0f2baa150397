//! The proxy username grammar: what a client asks for, `pool-crawlers.egress,session-abc`.
//! Parts joined by `,`, each `key-value` split at the first `-`; the error names the part and
//! what is accepted, because a crawler's author reads it in a 407 (or a SOCKS5 log line).

use super::Routing;

/// Longest username read: far above any real one, small enough that an error quoting parts
/// stays small.
pub const MAX_USERNAME: usize = 1024;

const KEYS: &str = "the keys are pool, session, zone, provider";

/// Parses a proxy username into what it asks for. Empty: no constraints.
pub fn parse_username(s: &str) -> Result<Routing, String> {
    if s.len() > MAX_USERNAME {
        return Err(format!(
            "the username is {} bytes, longer than {MAX_USERNAME}",
            s.len()
        ));
    }
    let mut routing = Routing::default();
    if s.is_empty() {
        return Ok(routing);
    }
    for (index, part) in s.split(',').enumerate() {
        let n = index + 1;
        let shown = quote(part);
        let Some((key, value)) = part.split_once('-') else {
            return Err(format!(
                "part {n} {shown}: expected key-value (e.g. session-abc); {KEYS}"
            ));
        };
        if value.is_empty() {
            return Err(format!(
                "part {n} {shown}: the value of `{}` is empty",
                quote_raw(key)
            ));
        }
        let slot_taken = |taken: bool| {
            if taken {
                Err(format!("part {n} {shown}: `{key}` is given twice"))
            } else {
                Ok(())
            }
        };
        let bad = |accepted: &str| format!("part {n} {shown}: {accepted}");
        match key {
            "pool" => {
                slot_taken(routing.pool.is_some())?;
                routing.pool = Some(pool(value).map_err(|m| bad(&m))?);
            }
            "session" => {
                slot_taken(routing.session.is_some())?;
                if value.len() > 64 || !value.bytes().all(is_session_byte) {
                    return Err(bad("a session is 1-64 characters of A-Z a-z 0-9 . _ ~"));
                }
                routing.session = Some(value.to_string());
            }
            "zone" => {
                slot_taken(routing.zone.is_some())?;
                if !is_label_ish(value) {
                    return Err(bad(
                        "a zone is up to 63 characters of a-z 0-9 - (e.g. europe-west1-b)",
                    ));
                }
                routing.zone = Some(value.to_string());
            }
            "provider" => {
                slot_taken(routing.provider.is_some())?;
                if !is_label_ish(value) {
                    return Err(bad(
                        "a provider is up to 63 characters of a-z 0-9 - (a provider instance's name)",
                    ));
                }
                routing.provider = Some(value.to_string());
            }
            other => {
                return Err(format!(
                    "part {n} {shown}: unknown key `{}`; {KEYS}",
                    quote_raw(other)
                ));
            }
        }
    }
    Ok(routing)
}

/// `namespace.name`: a DNS label, then a DNS subdomain (a pool's name may hold dots).
fn pool(value: &str) -> Result<(String, String), String> {
    let accepted = "a pool is <namespace>.<name> (e.g. pool-crawlers.egress), the namespace a DNS label and the name a DNS subdomain";
    let (namespace, name) = value.split_once('.').ok_or(accepted)?;
    let subdomain = name.len() <= 253 && name.split('.').all(is_dns_label);
    if is_dns_label(namespace) && subdomain {
        Ok((namespace.to_string(), name.to_string()))
    } else {
        Err(accepted.to_string())
    }
}

/// RFC 1123 label: lowercase alphanumerics and `-`, alphanumeric at both ends, ≤ 63.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Zones and provider names: lowercase alphanumerics and `-`, ≤ 63 (no rule on the ends: a
/// provider's zones are its own).
fn is_label_ish(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
}

fn is_session_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'~')
}

/// A part as an error shows it: in backticks, cut short and with control characters escaped,
/// so a hostile username cannot make a huge or multi-line log line.
fn quote(part: &str) -> String {
    format!("`{}`", quote_raw(part))
}

fn quote_raw(part: &str) -> String {
    const SHOWN: usize = 32;
    let mut shown: String = part
        .chars()
        .take(SHOWN)
        .flat_map(char::escape_debug)
        .collect();
    if part.chars().count() > SHOWN {
        shown.push('…');
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn routing(
        pool: Option<(&str, &str)>,
        session: Option<&str>,
        zone: Option<&str>,
        provider: Option<&str>,
    ) -> Routing {
        Routing {
            pool: pool.map(|(a, b)| (a.to_string(), b.to_string())),
            session: session.map(str::to_string),
            zone: zone.map(str::to_string),
            provider: provider.map(str::to_string),
        }
    }

    #[rstest]
    #[case::empty("", routing(None, None, None, None))]
    #[case::pool("pool-crawlers.egress", routing(Some(("crawlers", "egress")), None, None, None))]
    #[case::pool_name_with_dots("pool-ns.a.b", routing(Some(("ns", "a.b")), None, None, None))]
    #[case::session("session-abc", routing(None, Some("abc"), None, None))]
    #[case::session_charset("session-A.b_c~9", routing(None, Some("A.b_c~9"), None, None))]
    #[case::session_value_with_dash_is_split_at_first(
        "zone-europe-west1-b",
        routing(None, None, Some("europe-west1-b"), None)
    )]
    #[case::all(
        "pool-ns.pool,session-a,zone-z1,provider-gcp-eu",
        routing(Some(("ns", "pool")), Some("a"), Some("z1"), Some("gcp-eu"))
    )]
    #[case::any_order("provider-kvm,pool-ns.p", routing(Some(("ns", "p")), None, None, Some("kvm")))]
    fn accepted(#[case] input: &str, #[case] expected: Routing) {
        assert_eq!(parse_username(input), Ok(expected));
    }

    #[rstest]
    #[case::unknown_key(
        "pool-ns.p,sesion-abc",
        "part 2 `sesion-abc`: unknown key `sesion`; the keys are pool, session, zone, provider"
    )]
    #[case::no_dash("session", "part 1 `session`: expected key-value")]
    #[case::empty_value("session-", "part 1 `session-`: the value of `session` is empty")]
    #[case::twice("session-a,session-b", "part 2 `session-b`: `session` is given twice")]
    #[case::empty_part("session-a,", "part 2 ``: expected key-value")]
    #[case::session_too_long(&format!("session-{}", "a".repeat(65)), "a session is 1-64 characters")]
    #[case::session_bad_char("session-a/b", "part 1 `session-a/b`: a session is")]
    #[case::pool_no_dot("pool-egress", "a pool is <namespace>.<name>")]
    #[case::pool_upper("pool-NS.egress", "a pool is")]
    #[case::pool_empty_name("pool-ns.", "a pool is")]
    #[case::pool_bad_namespace("pool--ns.egress", "a pool is")]
    #[case::pool_bad_subdomain("pool-ns.a..b", "a pool is")]
    #[case::zone_upper("zone-EU", "part 1 `zone-EU`: a zone is")]
    #[case::provider_too_long(&format!("provider-{}", "a".repeat(64)), "a provider is up to 63")]
    #[case::provider_space("provider-a b", "a provider is")]
    #[case::too_long(&"session-a,".repeat(200), "longer than 1024")]
    #[case::newline_escaped("a\nb-c", "unknown key `a\\nb`")]
    #[case::unicode("sessión-x", "unknown key `sessión`")]
    #[case::unicode_value("session-é", "a session is")]
    fn refused(#[case] input: &str, #[case] expected: &str) {
        let error = parse_username(input).unwrap_err();
        assert!(error.contains(expected), "{input:?}: {error}");
    }

    #[test]
    fn hostile_input_never_panics_and_errors_stay_short() {
        let inputs = [
            ",".repeat(1024),
            ",".repeat(5000),
            "é".repeat(600),
            "-".repeat(1000),
            format!("pool-{}", ".".repeat(1000)),
            "\u{0}\u{202e}-\u{feff}".to_string(),
            format!("{}-x", "😀".repeat(200)),
        ];
        for input in inputs {
            if let Err(e) = parse_username(&input) {
                assert!(e.len() < 512, "{} bytes: {e}", e.len());
            }
        }
    }
}
