//! The allow-list of an HTTP grant: `scheme://host[:port]` patterns.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// `*`: any public host name or address.
    Any,
    /// `*.example.com`: any subdomain (not `example.com` itself).
    Suffix(String),
    /// An exact host name.
    Name(String),
    /// An IP address; the only way to grant a private or loopback address.
    Ip(IpAddr),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortPattern {
    Any,
    Exact(u16),
}

/// One allowed `scheme://host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowPattern {
    scheme: String,
    host: HostPattern,
    port: PortPattern,
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    scheme: String,
    host: TargetHost,
    port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TargetHost {
    Name(String),
    Ip(IpAddr),
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "https" { 443 } else { 80 }
}

impl Target {
    /// The scheme, host and port of an http(s) URL.
    pub fn from_url(url: &url::Url) -> Result<Self, String> {
        let scheme = url.scheme().to_string();
        if scheme != "http" && scheme != "https" {
            return Err(format!("scheme `{scheme}` is not http or https"));
        }
        let host = match url.host() {
            Some(url::Host::Domain(d)) => {
                TargetHost::Name(d.trim_end_matches('.').to_ascii_lowercase())
            }
            Some(url::Host::Ipv4(ip)) => TargetHost::Ip(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => TargetHost::Ip(IpAddr::V6(ip)),
            None => return Err(format!("url `{url}` has no host")),
        };
        let port = url.port().unwrap_or_else(|| default_port(&scheme));
        Ok(Target { scheme, host, port })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            TargetHost::Name(n) => write!(f, "{}://{}:{}", self.scheme, n, self.port),
            TargetHost::Ip(IpAddr::V6(ip)) => write!(f, "{}://[{}]:{}", self.scheme, ip, self.port),
            TargetHost::Ip(ip) => write!(f, "{}://{}:{}", self.scheme, ip, self.port),
        }
    }
}

impl AllowPattern {
    /// Parses `scheme://host[:port]`; the error says what is wrong and what is expected.
    pub fn parse(text: &str) -> Result<Self, String> {
        let expected = "expected scheme://host[:port], e.g. https://compute.googleapis.com or http://127.0.0.1:*";
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| format!("`{text}` has no scheme; {expected}"))?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return Err(format!("`{text}`: scheme must be http or https"));
        }
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') || rest.contains('?') || rest.contains('#') {
            return Err(format!(
                "`{text}`: a pattern names a host, not a path; {expected}"
            ));
        }
        if rest.contains('@') {
            return Err(format!("`{text}`: user info is not allowed in a pattern"));
        }
        let (host, port) = split_host_port(rest).map_err(|m| format!("`{text}`: {m}"))?;
        let port = match port {
            None => PortPattern::Exact(default_port(&scheme)),
            Some("*") => PortPattern::Any,
            Some(p) => PortPattern::Exact(
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("`{text}`: port `{p}` is not 1-65535 or *"))?,
            ),
        };
        let host = if host == "*" {
            HostPattern::Any
        } else if let Some(suffix) = host.strip_prefix("*.") {
            validate_name(suffix).map_err(|m| format!("`{text}`: {m}"))?;
            HostPattern::Suffix(suffix.to_ascii_lowercase())
        } else if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            HostPattern::Ip(IpAddr::V6(
                v6.parse::<Ipv6Addr>()
                    .map_err(|_| format!("`{text}`: `{v6}` is not an IPv6 address"))?,
            ))
        } else if let Ok(ip) = host.parse::<Ipv4Addr>() {
            HostPattern::Ip(IpAddr::V4(ip))
        } else {
            if host.contains('*') {
                return Err(format!(
                    "`{text}`: a wildcard must be the whole host (`*`) or a leading `*.`"
                ));
            }
            validate_name(host).map_err(|m| format!("`{text}`: {m}"))?;
            HostPattern::Name(host.to_ascii_lowercase())
        };
        Ok(AllowPattern { scheme, host, port })
    }

    /// Whether a request target is allowed by this pattern. Private addresses given as IP
    /// literals match only a pattern naming that very IP.
    pub fn matches(&self, target: &Target) -> bool {
        if self.scheme != target.scheme {
            return false;
        }
        if let PortPattern::Exact(p) = self.port
            && p != target.port
        {
            return false;
        }
        match (&self.host, &target.host) {
            (HostPattern::Ip(allowed), TargetHost::Ip(ip)) => allowed == ip,
            (HostPattern::Any, TargetHost::Ip(ip)) => is_public(*ip),
            (HostPattern::Any, TargetHost::Name(_)) => true,
            (HostPattern::Suffix(s), TargetHost::Name(n)) => {
                n.len() > s.len() + 1
                    && n.ends_with(s.as_str())
                    && n[..n.len() - s.len()].ends_with('.')
            }
            (HostPattern::Name(allowed), TargetHost::Name(n)) => allowed == n,
            _ => false,
        }
    }

    /// Whether every target this other pattern matches is also matched by this one.
    pub fn covers(&self, other: &AllowPattern) -> bool {
        if self.scheme != other.scheme {
            return false;
        }
        let port_ok = match (self.port, other.port) {
            (PortPattern::Any, _) => true,
            (PortPattern::Exact(a), PortPattern::Exact(b)) => a == b,
            (PortPattern::Exact(_), PortPattern::Any) => false,
        };
        let host_ok = match (&self.host, &other.host) {
            (a, b) if a == b => true,
            (HostPattern::Any, HostPattern::Ip(ip)) => is_public(*ip),
            (HostPattern::Any, _) => true,
            (HostPattern::Suffix(s), HostPattern::Suffix(o)) => o.ends_with(&format!(".{s}")),
            (HostPattern::Suffix(s), HostPattern::Name(n)) => n.ends_with(&format!(".{s}")),
            _ => false,
        };
        port_ok && host_ok
    }
}

impl fmt::Display for AllowPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match &self.host {
            HostPattern::Any => "*".to_string(),
            HostPattern::Suffix(s) => format!("*.{s}"),
            HostPattern::Name(n) => n.clone(),
            HostPattern::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
            HostPattern::Ip(ip) => ip.to_string(),
        };
        let port = match self.port {
            PortPattern::Any => "*".to_string(),
            PortPattern::Exact(p) => p.to_string(),
        };
        write!(f, "{}://{}:{}", self.scheme, host, port)
    }
}

fn split_host_port(rest: &str) -> Result<(&str, Option<&str>), String> {
    if rest.starts_with('[') {
        let end = rest.find(']').ok_or("unclosed `[` in an IPv6 address")?;
        let (host, after) = rest.split_at(end + 1);
        return match after.strip_prefix(':') {
            Some(port) => Ok((host, Some(port))),
            None if after.is_empty() => Ok((host, None)),
            None => Err(format!("unexpected `{after}` after the address")),
        };
    }
    match rest.rsplit_once(':') {
        Some((host, port)) => Ok((host, Some(port))),
        None => Ok((rest, None)),
    }
}

fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the host is empty".into());
    }
    let ok = name.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    });
    if ok {
        Ok(())
    } else {
        Err(format!("`{name}` is not a valid host name"))
    }
}

/// Whether an address is on the public internet: not loopback, private, link-local (which holds
/// cloud metadata servers), shared, unspecified, multicast or broadcast.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !SPECIAL_V4.iter().any(|(net, len)| in_v4(v4, *net, *len)),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            !SPECIAL_V6.iter().any(|(net, len)| in_v6(v6, *net, *len))
        }
    }
}

/// The IANA IPv4 Special-Purpose Address Registry (RFC 6890 and updates), every entry whether or
/// not it is marked globally reachable, plus multicast and the reserved 240/4: none of them is
/// where a cloud API lives, and several reach the host, the cluster or a metadata server.
const SPECIAL_V4: [(Ipv4Addr, u8); 21] = [
    (Ipv4Addr::new(0, 0, 0, 0), 8),       // "this network"
    (Ipv4Addr::new(10, 0, 0, 0), 8),      // private
    (Ipv4Addr::new(100, 64, 0, 0), 10),   // shared address space (CGNAT)
    (Ipv4Addr::new(127, 0, 0, 0), 8),     // loopback
    (Ipv4Addr::new(169, 254, 0, 0), 16),  // link-local (metadata servers)
    (Ipv4Addr::new(172, 16, 0, 0), 12),   // private
    (Ipv4Addr::new(192, 0, 0, 0), 24),    // IETF protocol assignments
    (Ipv4Addr::new(192, 0, 2, 0), 24),    // documentation
    (Ipv4Addr::new(192, 31, 196, 0), 24), // AS112-v4
    (Ipv4Addr::new(192, 52, 193, 0), 24), // AMT
    (Ipv4Addr::new(192, 88, 99, 0), 24),  // deprecated 6to4 relay anycast
    (Ipv4Addr::new(192, 168, 0, 0), 16),  // private
    (Ipv4Addr::new(192, 175, 48, 0), 24), // direct delegation AS112
    (Ipv4Addr::new(198, 18, 0, 0), 15),   // benchmarking
    (Ipv4Addr::new(198, 51, 100, 0), 24), // documentation
    (Ipv4Addr::new(203, 0, 113, 0), 24),  // documentation
    (Ipv4Addr::new(224, 0, 0, 0), 4),     // multicast
    (Ipv4Addr::new(240, 0, 0, 0), 4),     // reserved, and the limited broadcast
    (Ipv4Addr::new(255, 255, 255, 255), 32),
    (Ipv4Addr::new(192, 0, 0, 9), 32), // PCP anycast (inside 192.0.0.0/24 already)
    (Ipv4Addr::new(192, 0, 0, 10), 32), // TURN anycast (likewise)
];

/// The IANA IPv6 Special-Purpose Address Registry, every entry (NAT64 and 6to4 included: they
/// embed IPv4 addresses a gateway would reach for the plugin), plus ULA, link-local, site-local
/// and multicast.
const SPECIAL_V6: [(Ipv6Addr, u8); 17] = [
    (Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0), 128), // unspecified
    (Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 1), 128), // loopback
    (Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0), 96),  // IPv4-compatible (deprecated)
    (Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96), // NAT64 well-known prefix
    (Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48), // NAT64 local use
    (Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64), // discard-only
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 23), // IETF protocol assignments (Teredo, …)
    (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32), // documentation
    (Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16), // 6to4
    (Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20), // documentation
    (Ipv6Addr::new(0x5f00, 0, 0, 0, 0, 0, 0, 0), 16), // SRv6 SIDs
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7), // unique local
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10), // link-local
    (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10), // site-local (deprecated)
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8), // multicast
    (Ipv6Addr::new(0x2001, 0x2, 0, 0, 0, 0, 0, 0), 48), // benchmarking (inside 2001::/23)
    (Ipv6Addr::new(0x2001, 0x20, 0, 0, 0, 0, 0, 0), 28), // ORCHIDv2 (likewise)
];

/// Whether `ip` is in `net/len` (addresses of the other family never are).
pub(crate) fn in_network(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) => in_v4(ip, net, len),
        (IpAddr::V6(ip), IpAddr::V6(net)) => in_v6(ip, net, len),
        _ => false,
    }
}

fn in_v4(ip: Ipv4Addr, net: Ipv4Addr, len: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

fn in_v6(ip: Ipv6Addr, net: Ipv6Addr, len: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
    u128::from(ip) & mask == u128::from(net) & mask
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn target(url: &str) -> Target {
        Target::from_url(&url::Url::parse(url).unwrap()).unwrap()
    }

    #[rstest]
    #[case::exact_https(
        "https://compute.googleapis.com",
        "https://compute.googleapis.com/v1/x",
        true
    )]
    #[case::default_port_differs(
        "https://compute.googleapis.com",
        "https://compute.googleapis.com:8443/",
        false
    )]
    #[case::scheme_differs(
        "https://compute.googleapis.com",
        "http://compute.googleapis.com/",
        false
    )]
    #[case::other_host("https://compute.googleapis.com", "https://evil.example/", false)]
    #[case::host_case_insensitive(
        "https://Compute.GoogleAPIs.com",
        "https://compute.googleapis.com/",
        true
    )]
    #[case::suffix_matches_sub("https://*.example.com", "https://a.b.example.com/", true)]
    #[case::suffix_not_apex("https://*.example.com", "https://example.com/", false)]
    #[case::suffix_not_lookalike("https://*.example.com", "https://badexample.com/", false)]
    #[case::any_host_public_name("https://*", "https://anything.example/", true)]
    #[case::any_host_not_loopback_ip("http://*:*", "http://127.0.0.1:8080/", false)]
    #[case::any_host_not_metadata_ip("http://*", "http://169.254.169.254/", false)]
    #[case::any_host_public_ip("https://*", "https://8.8.8.8/", true)]
    #[case::named_loopback_any_port("http://127.0.0.1:*", "http://127.0.0.1:41234/x", true)]
    #[case::named_loopback_other_ip("http://127.0.0.1:*", "http://127.0.0.2:41234/x", false)]
    #[case::named_loopback_exact_port("http://127.0.0.1:8080", "http://127.0.0.1:8081/", false)]
    #[case::ipv6_loopback("http://[::1]:*", "http://[::1]:9000/", true)]
    #[case::trailing_slash("https://api.example.com/", "https://api.example.com/x", true)]
    fn pattern_matching(#[case] pattern: &str, #[case] url: &str, #[case] allowed: bool) {
        let p = AllowPattern::parse(pattern).unwrap();
        assert_eq!(p.matches(&target(url)), allowed, "{pattern} vs {url}");
    }

    #[rstest]
    #[case::no_scheme("compute.googleapis.com", "has no scheme")]
    #[case::ftp("ftp://example.com", "scheme must be http or https")]
    #[case::path("https://example.com/v1", "not a path")]
    #[case::bad_port("https://example.com:70000", "port `70000`")]
    #[case::zero_port("https://example.com:0", "port `0`")]
    #[case::inner_wildcard("https://api.*.com", "wildcard must be")]
    #[case::bad_name("https://exa mple.com", "not a valid host name")]
    #[case::user_info("https://user@example.com", "user info")]
    #[case::bad_v6("http://[::zz]:80", "not an IPv6 address")]
    #[case::empty_host("https://:443", "the host is empty")]
    fn pattern_errors(#[case] pattern: &str, #[case] expected: &str) {
        let err = AllowPattern::parse(pattern).unwrap_err();
        assert!(err.contains(expected), "{pattern}: {err}");
    }

    #[rstest]
    #[case::loopback("127.0.0.1", false)]
    #[case::ten("10.1.2.3", false)]
    #[case::one_seven_two("172.16.0.1", false)]
    #[case::one_nine_two("192.168.1.1", false)]
    #[case::metadata("169.254.169.254", false)]
    #[case::cgnat("100.64.0.1", false)]
    #[case::zero("0.0.0.0", false)]
    #[case::public("8.8.8.8", true)]
    #[case::v6_loopback("::1", false)]
    #[case::v6_ula("fd00::1", false)]
    #[case::v6_link_local("fe80::1", false)]
    #[case::v6_mapped_private("::ffff:10.0.0.1", false)]
    #[case::v6_public("2001:4860:4860::8888", true)]
    #[case::benchmarking("198.18.0.1", false)]
    #[case::relay_6to4("192.88.99.1", false)]
    #[case::documentation("203.0.113.9", false)]
    #[case::reserved("240.0.0.1", false)]
    #[case::broadcast("255.255.255.255", false)]
    #[case::multicast("224.0.0.251", false)]
    #[case::ietf_assignments("192.0.0.170", false)]
    #[case::public_next_to_cgnat("100.128.0.1", true)]
    #[case::public_next_to_benchmarking("198.20.0.1", true)]
    #[case::nat64_of_loopback("64:ff9b::7f00:1", false)]
    #[case::nat64_of_public("64:ff9b::808:808", false)]
    #[case::nat64_local_use("64:ff9b:1::1", false)]
    #[case::six_to_four("2002:7f00:1::1", false)]
    #[case::teredo("2001::1", false)]
    #[case::v6_documentation("2001:db8::1", false)]
    #[case::v6_site_local("fec0::1", false)]
    #[case::v6_discard("100::1", false)]
    #[case::v4_compatible("::7f00:1", false)]
    #[case::v6_multicast("ff02::1", false)]
    #[case::v6_public_cloudflare("2606:4700:4700::1111", true)]
    fn public_addresses(#[case] ip: &str, #[case] public: bool) {
        assert_eq!(is_public(ip.parse().unwrap()), public, "{ip}");
    }

    #[rstest]
    #[case::same("https://a.example.com", "https://a.example.com", true)]
    #[case::wildcard_port("http://127.0.0.1:*", "http://127.0.0.1:80", true)]
    #[case::suffix_covers_name("https://*.example.com", "https://a.example.com", true)]
    #[case::name_not_suffix("https://a.example.com", "https://*.example.com", false)]
    #[case::any_not_private_ip("http://*:*", "http://127.0.0.1:80", false)]
    fn covering(#[case] outer: &str, #[case] inner: &str, #[case] covers: bool) {
        let outer = AllowPattern::parse(outer).unwrap();
        let inner = AllowPattern::parse(inner).unwrap();
        assert_eq!(outer.covers(&inner), covers);
    }

    #[test]
    fn displays_normalised() {
        assert_eq!(
            AllowPattern::parse("HTTPS://API.example.com")
                .unwrap()
                .to_string(),
            "https://api.example.com:443"
        );
    }
}
