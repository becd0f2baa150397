//! Cooldowns for one target host: a proxy a site blocked stays leasable for every other site.
//! Bounded per proxy and in total, so reports naming ever new hosts cannot grow the table.

use std::collections::BTreeMap;

use super::keys::{FastMap, ProxyKey};
use super::sessions::{Digest, digest};

/// Longest target host name (the DNS limit).
pub const MAX_TARGET_BYTES: usize = 253;
/// Targets one proxy may cool down for at once; a block past it cools the whole proxy down (a
/// proxy that many sites block is blocked).
pub const MAX_TARGETS_PER_PROXY: usize = 16;
/// Target cooldowns over all proxies; a block past it cools the whole proxy down.
pub const MAX_TARGET_COOLDOWNS: usize = 2048;

/// A `target` as compared: a host name (lowercase, no trailing dot) or an IP address. What is
/// wrong otherwise, for a `400` naming the field. A host name is normalized in its own buffer
/// (the request's string; no allocation per grant).
pub fn normalize_target(mut target: String) -> Result<String, String> {
    if target.len() > MAX_TARGET_BYTES + 2 {
        return Err(format!(
            "is {} bytes long; a host name has at most {MAX_TARGET_BYTES}",
            target.len()
        ));
    }
    let bare = target
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(&target);
    if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
        return Ok(ip.to_string());
    }
    let host = target.strip_suffix('.').unwrap_or(&target);
    if host.is_empty() {
        return Err("must not be empty (omit it for no target)".into());
    }
    if host.len() > MAX_TARGET_BYTES {
        return Err(format!(
            "is {} bytes long; a host name has at most {MAX_TARGET_BYTES}",
            host.len()
        ));
    }
    for label in host.split('.') {
        let valid = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid {
            return Err(format!(
                "`{}` is not a host name (letters, digits, `-` and `.`, labels of 1 to 63; no \
                 scheme, port or path; an IDN in its ASCII form, `xn--…`)",
                target.escape_debug()
            ));
        }
    }
    let host_len = host.len();
    target.truncate(host_len);
    target.make_ascii_lowercase();
    Ok(target)
}

/// The digest of a normalized target.
pub(crate) fn target_digest(target: &str) -> Digest {
    digest(target.as_bytes())
}

/// Per-proxy cooldowns by target digest, each with its end (ms).
#[derive(Default)]
pub(crate) struct TargetCooldowns {
    by_proxy: FastMap<ProxyKey, Vec<(Digest, u64)>>,
    total: usize,
}

impl TargetCooldowns {
    pub(crate) fn len(&self) -> usize {
        self.total
    }

    /// When `proxy`'s cooldown for `target` ends, if it runs at `now`.
    pub(crate) fn until(&self, proxy: &ProxyKey, target: &Digest, now: u64) -> Option<u64> {
        self.by_proxy
            .get(proxy)?
            .iter()
            .find(|(d, until)| d == target && *until > now)
            .map(|(_, until)| *until)
    }

    /// Cools `proxy` down for `target` until `until`. False when a bound is reached: the caller
    /// cools the whole proxy down instead.
    pub(crate) fn insert(&mut self, proxy: &ProxyKey, target: Digest, until: u64) -> bool {
        if let Some(list) = self.by_proxy.get_mut(proxy) {
            if let Some(entry) = list.iter_mut().find(|(d, _)| *d == target) {
                entry.1 = entry.1.max(until);
                return true;
            }
            if list.len() >= MAX_TARGETS_PER_PROXY || self.total >= MAX_TARGET_COOLDOWNS {
                return false;
            }
            list.push((target, until));
        } else {
            if self.total >= MAX_TARGET_COOLDOWNS {
                return false;
            }
            self.by_proxy.insert(proxy.clone(), vec![(target, until)]);
        }
        self.total += 1;
        true
    }

    /// Forgets cooldowns that ended; whether any did.
    pub(crate) fn expire(&mut self, now: u64) -> bool {
        self.retain(|_, until| until > now)
    }

    /// Forgets the cooldowns of proxies `keep` refuses (deleted proxies); whether any.
    pub(crate) fn retain_proxies(&mut self, keep: impl Fn(&ProxyKey) -> bool) -> bool {
        self.retain(|proxy, _| keep(proxy))
    }

    fn retain(&mut self, keep: impl Fn(&ProxyKey, u64) -> bool) -> bool {
        let before = self.total;
        let mut total = 0;
        self.by_proxy.retain(|proxy, list| {
            list.retain(|(_, until)| keep(proxy, *until));
            total += list.len();
            !list.is_empty()
        });
        self.total = total;
        before != total
    }

    /// The persisted form: proxy → target digest (hex) → end (ms).
    pub(crate) fn to_snapshot(&self) -> BTreeMap<String, BTreeMap<String, u64>> {
        self.by_proxy
            .iter()
            .map(|(proxy, list)| {
                let targets = list.iter().map(|(d, u)| (hex::encode(d), *u)).collect();
                (proxy.to_string(), targets)
            })
            .collect()
    }

    /// Loads the persisted form, keeping what is still running and within the bounds.
    pub(crate) fn restore(&mut self, persisted: BTreeMap<String, BTreeMap<String, u64>>, now: u64) {
        for (proxy, targets) in persisted {
            let Some(proxy) = ProxyKey::parse(&proxy) else {
                continue;
            };
            for (text, until) in targets {
                let mut target = [0; 16];
                if until > now && hex::decode_to_slice(&text, &mut target).is_ok() {
                    self.insert(&proxy, target, until);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_host_names_or_ip_addresses() {
        for (input, expected) in [
            ("Example.COM", Ok("example.com")),
            ("shop.example.com.", Ok("shop.example.com")),
            ("my_host.internal", Ok("my_host.internal")),
            ("xn--bcher-kva.example", Ok("xn--bcher-kva.example")),
            ("192.0.2.7", Ok("192.0.2.7")),
            ("[2001:DB8::1]", Ok("2001:db8::1")),
            ("2001:db8::1", Ok("2001:db8::1")),
            ("", Err("empty")),
            (".", Err("empty")),
            ("https://example.com", Err("not a host name")),
            ("example.com:443", Err("not a host name")),
            ("example.com/path", Err("not a host name")),
            ("-bad.example", Err("not a host name")),
            ("a..b", Err("not a host name")),
            ("bücher.example", Err("xn--")),
        ] {
            match (normalize_target(input.into()), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{input}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{input}: {got}"),
                (got, want) => panic!("{input}: {got:?}, expected {want:?}"),
            }
        }
        let label = "a".repeat(63);
        let long = [label.as_str(); 4].join(".");
        assert_eq!(long.len(), 255);
        assert!(normalize_target(long).unwrap_err().contains("at most 253"));
        assert!(normalize_target("a".repeat(64)).is_err());
        assert!(
            normalize_target("a.".repeat(5000))
                .unwrap_err()
                .contains("bytes")
        );
    }

    fn key(i: usize) -> ProxyKey {
        ProxyKey {
            namespace: "ns".into(),
            name: format!("p{i}").into(),
        }
    }

    #[test]
    fn cooldowns_are_bounded_per_proxy_and_in_total() {
        let mut cooldowns = TargetCooldowns::default();
        // One proxy, hosts without end: the 17th is refused (the caller cools the proxy down).
        for i in 0..MAX_TARGETS_PER_PROXY {
            assert!(cooldowns.insert(&key(0), digest(format!("h{i}").as_bytes()), 10));
        }
        assert!(!cooldowns.insert(&key(0), digest(b"one more"), 10));
        // The same host again only moves its end.
        assert!(cooldowns.insert(&key(0), digest(b"h0"), 20));
        assert_eq!(cooldowns.until(&key(0), &digest(b"h0"), 0), Some(20));
        assert_eq!(cooldowns.len(), MAX_TARGETS_PER_PROXY);
        // Many proxies: the total bound holds.
        let mut i = 1;
        while cooldowns.insert(&key(i), digest(b"h"), 10) {
            i += 1;
        }
        assert_eq!(cooldowns.len(), MAX_TARGET_COOLDOWNS);
        assert!(!cooldowns.insert(&key(i + 1), digest(b"h"), 10));
        // Ended cooldowns are forgotten, and room is made again.
        assert!(cooldowns.expire(15));
        assert_eq!(cooldowns.len(), 1);
        assert_eq!(cooldowns.until(&key(0), &digest(b"h0"), 15), Some(20));
        assert_eq!(cooldowns.until(&key(0), &digest(b"h0"), 20), None);
    }

    #[test]
    fn the_persisted_form_round_trips_and_drops_what_ended() {
        let mut cooldowns = TargetCooldowns::default();
        cooldowns.insert(&key(1), target_digest("a.example"), 100);
        cooldowns.insert(&key(1), target_digest("b.example"), 5);
        let mut restored = TargetCooldowns::default();
        restored.restore(cooldowns.to_snapshot(), 10);
        assert_eq!(restored.len(), 1);
        assert_eq!(
            restored.until(&key(1), &target_digest("a.example"), 10),
            Some(100)
        );
        assert!(restored.retain_proxies(|_| false));
        assert_eq!(restored.len(), 0);
    }
}
