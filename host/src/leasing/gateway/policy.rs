//! Where the gateway lets clients go: a port set, and no address or name inside the network the
//! upstream proxies stand in (loopback, private, link-local, the cluster's names) unless an
//! operator allowed it. Checked before an upstream is asked for, on the host as the client named
//! it: the gateway never resolves a name, the upstream does, so names that only mean something
//! inside a network are refused by name.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::provider::capabilities::http::{in_network, is_public};

use super::Destination;

/// Names that resolve to the proxy's own host or network, never to a site on the internet.
const INTERNAL_SUFFIXES: [&str; 5] = ["localhost", "local", "internal", "svc", "cluster.local"];

/// The destinations a client may reach through the gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DestinationPolicy {
    /// Destination ports allowed (default 80 and 443).
    pub ports: Vec<u16>,
    /// Non-public networks allowed anyway (IP literals inside them pass).
    pub allowed_networks: Vec<Network>,
    /// Host names allowed although they look internal (`example.svc` allows `example.svc` and
    /// `a.example.svc`).
    pub allowed_host_suffixes: Vec<String>,
}

impl Default for DestinationPolicy {
    fn default() -> Self {
        DestinationPolicy {
            ports: vec![80, 443],
            allowed_networks: Vec::new(),
            allowed_host_suffixes: Vec::new(),
        }
    }
}

impl DestinationPolicy {
    /// `Err(reason)` when the destination is refused; the reason goes to the client.
    pub fn check(&self, d: &Destination) -> Result<(), String> {
        if !self.ports.contains(&d.port) {
            return Err(format!(
                "port {} is not allowed (allowed: {})",
                d.port,
                Ports(self.ports.clone())
            ));
        }
        let host = d.host.as_str();
        if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            return match inner.parse::<std::net::Ipv6Addr>() {
                Ok(ip) => self.check_ip(IpAddr::V6(ip)),
                Err(_) => Err(format!("`{}` is not an IPv6 address", shown(host))),
            };
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            return self.check_ip(ip);
        }
        self.check_name(host)
    }

    fn check_ip(&self, ip: IpAddr) -> Result<(), String> {
        // `::ffff:127.0.0.1` is 127.0.0.1 to whoever connects to it.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        if self
            .allowed_networks
            .iter()
            .any(|n| in_network(ip, n.addr, n.prefix))
        {
            return Ok(());
        }
        if is_public(ip) {
            Ok(())
        } else {
            Err(format!(
                "{ip} is not a public address (loopback, private, link-local, shared, multicast or reserved)"
            ))
        }
    }

    fn check_name(&self, host: &str) -> Result<(), String> {
        let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
        let valid = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
            });
        if !valid {
            return Err(format!("`{}` is not a host name", shown(host)));
        }
        if self
            .allowed_host_suffixes
            .iter()
            .any(|s| has_suffix(&name, s))
        {
            return Ok(());
        }
        let last = name.rsplit('.').next().unwrap_or_default();
        // Resolvers read `2130706433`, `0x7f.1` or `127.1` as IPv4 addresses (here, loopback).
        let numeric = last.bytes().all(|c| c.is_ascii_digit())
            || last
                .strip_prefix("0x")
                .is_some_and(|h| h.bytes().all(|c| c.is_ascii_hexdigit()));
        if numeric {
            return Err(format!(
                "`{}` looks like a number but is not an IP address in dotted form",
                shown(host)
            ));
        }
        if let Some(suffix) = INTERNAL_SUFFIXES.iter().find(|s| has_suffix(&name, s)) {
            return Err(format!(
                "`{}` is an internal name (*.{suffix}), not a site on the internet",
                shown(host)
            ));
        }
        // A single label is completed by the search domains of the proxy's network.
        if !name.contains('.') {
            return Err(format!(
                "`{}` is a single-label name; give the full name",
                shown(host)
            ));
        }
        Ok(())
    }
}

/// `name` is `suffix` or ends with `.suffix`.
fn has_suffix(name: &str, suffix: &str) -> bool {
    name == suffix
        || (name.len() > suffix.len()
            && name.ends_with(suffix)
            && name.as_bytes()[name.len() - suffix.len() - 1] == b'.')
}

/// A host as an error shows it: short, control characters escaped.
fn shown(host: &str) -> String {
    host.chars()
        .take(255)
        .flat_map(char::escape_debug)
        .collect()
}

/// An IP network, `10.0.0.0/8` or `::1/128` (a bare address is a /32 or /128).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Network {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl FromStr for Network {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("`{s}`: `{addr}` is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{s}`: the prefix length must be 0-{max}"))?,
        };
        Ok(Network { addr, prefix })
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A comma-separated list of networks, for a command-line flag: `127.0.0.0/8,::1/128`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Networks(pub Vec<Network>);

impl FromStr for Networks {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        list(s)
            .map(|item| item.parse::<Network>())
            .collect::<Result<_, _>>()
            .map(Networks)
    }
}

/// A comma-separated list of ports, for a command-line flag: `80,443`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ports(pub Vec<u16>);

impl FromStr for Ports {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let ports: Vec<u16> = list(s)
            .map(|item| {
                item.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("`{item}` is not a port (1-65535)"))
            })
            .collect::<Result<_, _>>()?;
        if ports.is_empty() {
            return Err("no ports given (e.g. 80,443)".into());
        }
        Ok(Ports(ports))
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text: Vec<String> = self.0.iter().map(u16::to_string).collect();
        f.write_str(&text.join(", "))
    }
}

/// A comma-separated list of host name suffixes, for a command-line flag: `corp.example,svc`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostSuffixes(pub Vec<String>);

impl FromStr for HostSuffixes {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        list(s)
            .map(|item| {
                let name = item.trim_start_matches("*.").trim_end_matches('.');
                let valid = !name.is_empty()
                    && name.split('.').all(|l| {
                        !l.is_empty() && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
                    });
                if valid {
                    Ok(name.to_ascii_lowercase())
                } else {
                    Err(format!("`{item}` is not a host name suffix"))
                }
            })
            .collect::<Result<_, _>>()
            .map(HostSuffixes)
    }
}

/// The trimmed, non-empty items of a comma-separated list.
fn list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|i| !i.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn policy() -> DestinationPolicy {
        DestinationPolicy {
            ports: vec![80, 443, 8080],
            allowed_networks: "127.0.0.1/32,fd00::/8".parse::<Networks>().unwrap().0,
            allowed_host_suffixes: vec!["svc.example".into()],
        }
    }

    fn check(policy: &DestinationPolicy, host: &str, port: u16) -> Result<(), String> {
        policy.check(&Destination {
            host: host.to_string(),
            port,
        })
    }

    #[rstest]
    #[case::name("example.com", 443, true)]
    #[case::name_trailing_dot("example.com.", 80, true)]
    #[case::public_v4("93.184.216.34", 80, true)]
    #[case::public_v6("2606:2800:220:1::1", 443, true)]
    #[case::public_v6_bracketed("[2606:2800:220:1::1]", 443, true)]
    #[case::port_25("example.com", 25, false)]
    #[case::port_0("example.com", 0, false)]
    #[case::loopback("127.0.0.2", 80, false)]
    #[case::unspecified("0.0.0.0", 80, false)]
    #[case::private_10("10.0.0.1", 80, false)]
    #[case::private_172("172.16.3.4", 443, false)]
    #[case::private_192("192.168.1.1", 443, false)]
    #[case::cgnat("100.64.0.1", 443, false)]
    #[case::link_local_metadata("169.254.169.254", 80, false)]
    #[case::multicast("224.0.0.1", 80, false)]
    #[case::broadcast("255.255.255.255", 80, false)]
    #[case::v6_loopback("::1", 80, false)]
    #[case::v6_loopback_bracketed("[::1]", 80, false)]
    #[case::v6_unspecified("[::]", 80, false)]
    #[case::v6_link_local("[fe80::1]", 80, false)]
    #[case::v6_ula("[fc00::1]", 80, false)]
    #[case::v6_multicast("[ff02::1]", 80, false)]
    #[case::v4_mapped_private("[::ffff:10.0.0.1]", 80, false)]
    #[case::v4_mapped_public("[::ffff:93.184.216.34]", 80, true)]
    #[case::bad_bracket("[127.0.0.1]", 80, false)]
    #[case::zone_id("[fe80::1%eth0]", 80, false)]
    #[case::localhost("localhost", 80, false)]
    #[case::localhost_upper_dot("LocalHost.", 80, false)]
    #[case::sub_localhost("a.localhost", 80, false)]
    #[case::dot_local("printer.local", 80, false)]
    #[case::dot_internal("metadata.google.internal", 80, false)]
    #[case::dot_svc("kubernetes.default.svc", 443, false)]
    #[case::cluster_local("kubernetes.default.svc.cluster.local", 443, false)]
    #[case::single_label("kubernetes", 443, false)]
    #[case::decimal("2130706433", 80, false)]
    #[case::hex("0x7f.1", 80, false)]
    #[case::short_dotted("127.1", 80, false)]
    #[case::octal("0177.0.0.1", 80, false)]
    #[case::name_ending_in_digits_label("host.123", 80, false)]
    #[case::digits_inside_name("1.2.3.4.nip.io", 80, true)]
    #[case::space("exa mple.com", 80, false)]
    #[case::empty("", 80, false)]
    #[case::unicode("exämple.com", 80, false)]
    #[case::allowed_loopback_net("127.0.0.1", 8080, true)]
    #[case::allowed_mapped_loopback("[::ffff:127.0.0.1]", 8080, true)]
    #[case::allowed_v6_net("[fd00::5]", 443, true)]
    #[case::allowed_net_still_checks_port("127.0.0.1", 25, false)]
    #[case::allowed_suffix("api.svc.example", 443, true)]
    #[case::allowed_suffix_itself("svc.example", 443, true)]
    #[case::not_the_suffix("xsvc.example", 443, true)]
    fn destinations(#[case] host: &str, #[case] port: u16, #[case] allowed: bool) {
        let result = check(&policy(), host, port);
        assert_eq!(result.is_ok(), allowed, "{host}:{port}: {result:?}");
    }

    #[test]
    fn default_allows_80_and_443_and_no_private_network() {
        let p = DestinationPolicy::default();
        assert_eq!(check(&p, "example.com", 443), Ok(()));
        let e = check(&p, "example.com", 8080).unwrap_err();
        assert_eq!(e, "port 8080 is not allowed (allowed: 80, 443)");
        let e = check(&p, "127.0.0.1", 80).unwrap_err();
        assert!(e.contains("127.0.0.1 is not a public address"), "{e}");
        let e = check(&p, "a.svc.cluster.local", 80).unwrap_err();
        assert!(e.contains("internal name"), "{e}");
    }

    #[rstest]
    #[case::one("443", Ok(vec![443]))]
    #[case::two_spaced("80, 443", Ok(vec![80, 443]))]
    #[case::bad("80,http", Err("`http` is not a port (1-65535)".to_string()))]
    #[case::zero("0", Err("`0` is not a port (1-65535)".to_string()))]
    #[case::too_big("65536", Err("`65536` is not a port (1-65535)".to_string()))]
    #[case::empty("", Err("no ports given (e.g. 80,443)".to_string()))]
    fn ports_from_flags(#[case] text: &str, #[case] expected: Result<Vec<u16>, String>) {
        assert_eq!(text.parse::<Ports>().map(|p| p.0), expected);
    }

    #[rstest]
    #[case::two("127.0.0.0/8,::1/128", Ok(vec!["127.0.0.0/8", "::1/128"]))]
    #[case::bare("10.1.2.3", Ok(vec!["10.1.2.3/32"]))]
    #[case::empty("", Ok(vec![]))]
    #[case::bad_addr("127.0.0.0/8,nope/8", Err("`nope/8`: `nope` is not an IP address"))]
    #[case::bad_prefix("10.0.0.0/33", Err("`10.0.0.0/33`: the prefix length must be 0-32"))]
    #[case::bad_v6_prefix("::/129", Err("`::/129`: the prefix length must be 0-128"))]
    fn networks_from_flags(#[case] text: &str, #[case] expected: Result<Vec<&str>, &str>) {
        let parsed = text
            .parse::<Networks>()
            .map(|n| n.0.iter().map(Network::to_string).collect::<Vec<_>>());
        let expected = expected
            .map(|v| v.into_iter().map(str::to_string).collect::<Vec<_>>())
            .map_err(str::to_string);
        assert_eq!(parsed, expected);
    }

    #[rstest]
    #[case::two("corp.example, *.svc", Ok(vec!["corp.example", "svc"]))]
    #[case::bad("corp example", Err("`corp example` is not a host name suffix"))]
    fn suffixes_from_flags(#[case] text: &str, #[case] expected: Result<Vec<&str>, &str>) {
        let expected = expected
            .map(|v| v.into_iter().map(str::to_string).collect::<Vec<_>>())
            .map_err(str::to_string);
        assert_eq!(text.parse::<HostSuffixes>().map(|s| s.0), expected);
    }
}
