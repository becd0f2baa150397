//! Cooldowns for one target host: a proxy a site blocked stays leasable for every other site.
//! Bounded per proxy and in total, so reports naming ever new hosts cannot grow the table.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::keys::{FastMap, ProxyKey};
use super::sessions::{Digest, digest};

/// Longest target host name (the DNS limit).
pub const MAX_TARGET_BYTES: usize = 253;
/// Targets one proxy may cool down for at once, by default; a block past it cools the whole proxy
/// down (a proxy that many sites block is blocked). `--max-targets-per-proxy`.
pub const MAX_TARGETS_PER_PROXY: usize = 1024;
/// Target cooldowns over all proxies, by default; a block past it cools the whole proxy down.
/// Held in memory (about 90 bytes each, docs/performance.md), not in the cluster.
/// `--max-target-cooldowns`.
pub const MAX_TARGET_COOLDOWNS: usize = 1_000_000;
/// Target cooldowns a checkpoint of the table keeps (those ending last): a failover keeps these
/// and every one recorded since the checkpoint (docs/architecture.md).
pub const CHECKPOINTED_TARGET_COOLDOWNS: usize = 16_384;

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

/// A host as the persisted table names it (the hex digest of the normalized host, as in a
/// checkpoint's `targetCooldowns` and a journal's `t` lines), or why it is no host. Readers of
/// the table (`kubectl px status --target`) find a host's cooldowns by it.
pub fn persisted_target(host: &str) -> Result<String, String> {
    normalize_target(host.to_string()).map(|t| hex::encode(target_digest(&t)))
}

/// Cooldowns by proxy, then target digest, each with its end (ms). A grant's check of a
/// candidate is a lookup of the proxy (a map of the fleet's proxies, small enough to stay in
/// cache) and one in that proxy's own map (at most `max_per_proxy` entries), whatever the total
/// held: a million cooldowns in one map made every check a cache miss, under the table's lock
/// (docs/performance.md). Ends are forgotten in order, from a min-heap, so expiry touches only
/// what ended.
pub(crate) struct TargetCooldowns {
    by_proxy: FastMap<ProxyKey, FastMap<Digest, u64>>,
    /// Cooldowns held, over all proxies.
    total: usize,
    /// (end, proxy, target), soonest first. An entry whose end moved later is stale (the map
    /// holds the later end) and skipped when it comes up.
    ends: BinaryHeap<Reverse<(u64, ProxyKey, Digest)>>,
    max_total: usize,
    max_per_proxy: usize,
}

impl Default for TargetCooldowns {
    fn default() -> Self {
        TargetCooldowns::with_bounds(MAX_TARGET_COOLDOWNS, MAX_TARGETS_PER_PROXY)
    }
}

impl TargetCooldowns {
    pub(crate) fn with_bounds(max_total: usize, max_per_proxy: usize) -> Self {
        TargetCooldowns {
            by_proxy: FastMap::default(),
            total: 0,
            ends: BinaryHeap::new(),
            max_total,
            max_per_proxy,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.total
    }

    fn end_of(&self, proxy: &ProxyKey, target: &Digest) -> Option<u64> {
        self.by_proxy.get(proxy)?.get(target).copied()
    }

    /// When `proxy`'s cooldown for `target` ends, if it runs at `now`.
    pub(crate) fn until(&self, proxy: &ProxyKey, target: &Digest, now: u64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        self.end_of(proxy, target).filter(|until| *until > now)
    }

    /// Cools `proxy` down for `target` until `until`. False when a bound is reached: the caller
    /// cools the whole proxy down instead.
    pub(crate) fn insert(&mut self, proxy: &ProxyKey, target: Digest, until: u64) -> bool {
        let targets = self.by_proxy.get(proxy);
        match targets.and_then(|t| t.get(&target)) {
            Some(end) if until <= *end => return true,
            Some(_) => {}
            None if targets.map_or(0, FastMap::len) >= self.max_per_proxy
                || self.total >= self.max_total =>
            {
                return false;
            }
            None => self.total += 1,
        }
        self.by_proxy
            .entry(proxy.clone())
            .or_default()
            .insert(target, until);
        self.ends.push(Reverse((until, proxy.clone(), target)));
        true
    }

    fn remove(&mut self, proxy: &ProxyKey, target: &Digest) {
        if let Some(targets) = self.by_proxy.get_mut(proxy)
            && targets.remove(target).is_some()
        {
            self.total -= 1;
            if targets.is_empty() {
                self.by_proxy.remove(proxy);
            }
        }
    }

    /// Drops the heap's entries that no longer name a held end.
    fn drop_stale_ends(&mut self) {
        let by_proxy = &self.by_proxy;
        self.ends.retain(|Reverse((end, proxy, target))| {
            by_proxy.get(proxy).and_then(|t| t.get(target)) == Some(end)
        });
    }

    /// Forgets cooldowns that ended; whether any did.
    pub(crate) fn expire(&mut self, now: u64) -> bool {
        let before = self.total;
        while let Some(Reverse((end, _, _))) = self.ends.peek() {
            if *end > now {
                break;
            }
            let Reverse((end, proxy, target)) = self.ends.pop().expect("checked above");
            if self.end_of(&proxy, &target) == Some(end) {
                self.remove(&proxy, &target);
            }
        }
        if self.ends.len() > 2 * self.total + 64 {
            self.drop_stale_ends();
        }
        before != self.total
    }

    /// Forgets the cooldowns of proxies `keep` refuses (deleted proxies); whether any.
    pub(crate) fn retain_proxies(&mut self, keep: impl Fn(&ProxyKey) -> bool) -> bool {
        let before = self.total;
        let total = &mut self.total;
        self.by_proxy.retain(|proxy, targets| {
            let kept = keep(proxy);
            if !kept {
                *total -= targets.len();
            }
            kept
        });
        if before == self.total {
            return false;
        }
        self.drop_stale_ends();
        true
    }

    /// The persisted form: proxy → target digest (hex) → end (ms); at most `limit`, those ending
    /// last.
    pub(crate) fn to_snapshot(&self, limit: usize) -> BTreeMap<String, BTreeMap<String, u64>> {
        let mut entries: Vec<(&ProxyKey, &Digest, u64)> = self
            .by_proxy
            .iter()
            .flat_map(|(proxy, targets)| {
                targets
                    .iter()
                    .map(move |(target, end)| (proxy, target, *end))
            })
            .collect();
        if entries.len() > limit {
            entries.select_nth_unstable_by_key(limit, |(_, _, end)| Reverse(*end));
            entries.truncate(limit);
        }
        let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for (proxy, target, end) in entries {
            out.entry(proxy.to_string())
                .or_default()
                .insert(hex::encode(target), end);
        }
        out
    }

    /// Loads the persisted form, keeping what is still running and within the bounds.
    pub(crate) fn restore(&mut self, persisted: BTreeMap<String, BTreeMap<String, u64>>, now: u64) {
        let mut loaded: Vec<(u64, ProxyKey, Digest)> = Vec::new();
        for (proxy, targets) in persisted {
            let Some(proxy) = ProxyKey::parse(&proxy) else {
                continue;
            };
            for (text, until) in targets {
                let mut target = [0; 16];
                if until > now && hex::decode_to_slice(&text, &mut target).is_ok() {
                    loaded.push((until, proxy.clone(), target));
                }
            }
        }
        for (until, proxy, target) in loaded {
            self.insert(&proxy, target, until);
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
        let mut cooldowns = TargetCooldowns::with_bounds(40, 16);
        // One proxy, hosts without end: the 17th is refused (the caller cools the proxy down).
        for i in 0..16 {
            assert!(cooldowns.insert(&key(0), digest(format!("h{i}").as_bytes()), 10));
        }
        assert!(!cooldowns.insert(&key(0), digest(b"one more"), 10));
        // The same host again only moves its end.
        assert!(cooldowns.insert(&key(0), digest(b"h0"), 20));
        assert_eq!(cooldowns.until(&key(0), &digest(b"h0"), 0), Some(20));
        assert_eq!(cooldowns.len(), 16);
        // Many proxies: the total bound holds.
        let mut i = 1;
        while cooldowns.insert(&key(i), digest(b"h"), 10) {
            i += 1;
        }
        assert_eq!(cooldowns.len(), 40);
        assert!(!cooldowns.insert(&key(i + 1), digest(b"h"), 10));
        // Ended cooldowns are forgotten, and room is made again.
        assert!(cooldowns.expire(15));
        assert_eq!(cooldowns.len(), 1);
        assert_eq!(cooldowns.until(&key(0), &digest(b"h0"), 15), Some(20));
        assert_eq!(cooldowns.until(&key(0), &digest(b"h0"), 20), None);
        assert!(cooldowns.expire(20));
        assert_eq!(cooldowns.len(), 0);
        assert!(cooldowns.by_proxy.is_empty());
        assert!(cooldowns.insert(&key(0), digest(b"again"), 30));
    }

    /// A million cooldowns: held within the bound, each looked up by one hash, and forgotten
    /// in order as they end, the queue staying bounded.
    #[test]
    fn a_million_cooldowns_expire_in_order_and_the_queue_stays_bounded() {
        let mut cooldowns = TargetCooldowns::default();
        for i in 0..1_000_000u64 {
            let proxy = key((i % 10_000) as usize);
            assert!(cooldowns.insert(&proxy, digest(&i.to_le_bytes()), 1_000 + i / 1000));
        }
        assert_eq!(cooldowns.len(), MAX_TARGET_COOLDOWNS);
        assert!(!cooldowns.insert(&key(1), digest(b"past the bound"), 5_000));
        assert_eq!(
            cooldowns.until(&key(7), &digest(&7u64.to_le_bytes()), 0),
            Some(1_000)
        );
        assert!(cooldowns.expire(1_499));
        assert_eq!(cooldowns.len(), 500_000);
        assert!(cooldowns.ends.len() <= 2 * cooldowns.len() + 64);
        let snapshot = cooldowns.to_snapshot(CHECKPOINTED_TARGET_COOLDOWNS);
        assert_eq!(
            snapshot.values().map(BTreeMap::len).sum::<usize>(),
            CHECKPOINTED_TARGET_COOLDOWNS
        );
        // Those ending last are the ones a checkpoint keeps.
        assert!(
            snapshot
                .values()
                .flat_map(|t| t.values())
                .all(|end| *end >= 1_983)
        );
    }

    #[test]
    fn the_persisted_form_round_trips_and_drops_what_ended() {
        let mut cooldowns = TargetCooldowns::default();
        cooldowns.insert(&key(1), target_digest("a.example"), 100);
        cooldowns.insert(&key(1), target_digest("b.example"), 5);
        let mut restored = TargetCooldowns::default();
        restored.restore(cooldowns.to_snapshot(usize::MAX), 10);
        assert_eq!(restored.len(), 1);
        assert_eq!(
            restored.until(&key(1), &target_digest("a.example"), 10),
            Some(100)
        );
        assert!(restored.retain_proxies(|_| false));
        assert_eq!(restored.len(), 0);
    }
}
