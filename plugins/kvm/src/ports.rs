//! Published ports of VMs on a user-mode network: one per VM on a host, chosen from the host's
//! `portRange` and recorded in the domain's metadata, so the choice is read back from the domains
//! after an operator restart rather than kept anywhere else.
//!
//! Two creates on one host may run at once and see the same free port. Each defines its domain
//! first and then looks again ([`must_yield`]): of two domains claiming one port, the one that is
//! already running keeps it, else the one with the smaller name; the other is undefined and its
//! create retried, which then sees the port taken.

use std::collections::BTreeSet;

use crate::config::PortRange;
use crate::names::fnv1a;

/// A port of `range` that no domain in `used` has, starting at a place derived from the owner's
/// UID (so concurrent creates of different Proxies rarely start at the same port). `None`: every
/// port of the range is taken.
pub fn choose(range: PortRange, used: &BTreeSet<u16>, owner_uid: &str) -> Option<u16> {
    let len = range.count();
    let start = (fnv1a(owner_uid.as_bytes()) % u64::from(len)) as u32;
    (0..len)
        .map(|i| (u32::from(range.first) + (start + i) % len) as u16)
        .find(|port| !used.contains(port))
}

/// Another domain on the host that claims a published port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim<'a> {
    pub domain: &'a str,
    pub port: u16,
    pub running: bool,
}

/// Whether domain `ours`, just defined with `port`, must give the port up to one of `others`.
pub fn must_yield(ours: &str, port: u16, others: &[Claim<'_>]) -> bool {
    others
        .iter()
        .filter(|c| c.domain != ours && c.port == port)
        .any(|c| c.running || c.domain < ours)
}

/// The message of a `quota` error when every port of the range is taken.
pub fn exhausted_message(host: &str, range: PortRange) -> String {
    format!(
        "host {host}: every port of network.portRange {}-{} ({} ports) is published by a VM already; widen config.hosts[].network.portRange or delete Proxies on this host",
        range.first,
        range.last,
        range.count()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANGE: PortRange = PortRange {
        first: 20000,
        last: 20003,
    };

    #[test]
    fn choice_is_stable_free_and_within_the_range() {
        let used = BTreeSet::new();
        let port = choose(RANGE, &used, "uid-1").unwrap();
        assert!(RANGE.contains(port));
        assert_eq!(choose(RANGE, &used, "uid-1"), Some(port));
        // Taken ports are skipped, wrapping around the end of the range.
        let mut used: BTreeSet<u16> = [port].into();
        let next = choose(RANGE, &used, "uid-1").unwrap();
        assert_ne!(next, port);
        assert_eq!(next, if port == 20003 { 20000 } else { port + 1 });
        used.extend([20000, 20001, 20002, 20003]);
        assert_eq!(choose(RANGE, &used, "uid-1"), None);
        // Ports outside the range do not count.
        let outside: BTreeSet<u16> = [19999, 20004].into();
        assert!(choose(RANGE, &outside, "uid-2").is_some());
    }

    #[test]
    fn different_owners_spread_over_the_range() {
        let used = BTreeSet::new();
        let starts: BTreeSet<u16> = (0..64)
            .filter_map(|i| choose(RANGE, &used, &format!("uid-{i}")))
            .collect();
        assert_eq!(starts.len(), 4, "{starts:?}");
    }

    #[test]
    fn exactly_one_of_two_claimants_yields() {
        let claim = |domain, running| Claim {
            domain,
            port: 20001,
            running,
        };
        // Both defined, neither running: the larger name yields.
        assert!(must_yield("px-b", 20001, &[claim("px-a", false)]));
        assert!(!must_yield("px-a", 20001, &[claim("px-b", false)]));
        // A running domain keeps its port whatever its name.
        assert!(must_yield("px-a", 20001, &[claim("px-b", true)]));
        // Other ports, and the domain itself, are no conflict.
        assert!(!must_yield("px-b", 20002, &[claim("px-a", true)]));
        assert!(!must_yield("px-b", 20001, &[claim("px-b", true)]));
    }

    #[test]
    fn exhaustion_names_the_field_and_the_fix() {
        assert_eq!(
            exhausted_message("hv1", RANGE),
            "host hv1: every port of network.portRange 20000-20003 (4 ports) is published by a VM already; widen config.hosts[].network.portRange or delete Proxies on this host"
        );
    }
}
