//! Sticky sessions: which proxy a crawler's `session` key last had. Keys are kept as 128-bit
//! digests: fixed-size map keys (no allocation per grant) and a compact persisted table.

use std::collections::{BTreeMap, VecDeque};

use sha2::{Digest as _, Sha256};

use super::keys::{FastMap, ProxyKey};

/// Longest `session` key, in characters (Unicode scalar values, as JSON Schema's `maxLength` in
/// the OpenAPI document counts them; at most 1 KiB of UTF-8).
pub const MAX_SESSION_CHARS: usize = 256;
/// Sessions remembered at once, by default; past it one unused the longest is forgotten. Held
/// in memory only (about 180 bytes each, docs/performance.md); a failover rebuilds those of
/// the leases it restores (docs/architecture.md). `--max-sessions`.
pub const MAX_SESSIONS: usize = 1_000_000;

/// A session key or a target host, hashed: the first 128 bits of SHA-256, stable across
/// restarts (persisted) and not open to chosen collisions.
pub(crate) type Digest = [u8; 16];

pub(crate) fn digest(bytes: &[u8]) -> Digest {
    let full = Sha256::digest(bytes);
    let mut out = [0; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// A session's key as the table keeps it: the digest of its holder (empty for the static
/// token) and the key, so the same key from two holders is two sessions.
pub(crate) fn session_digest(holder: Option<&str>, session: &str) -> Digest {
    let full = Sha256::new()
        .chain_update(holder.unwrap_or_default())
        .chain_update([0])
        .chain_update(session)
        .finalize();
    let mut out = [0; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// Checks a `session` key: 1 to 256 bytes, no control characters (they would be escaped six-fold
/// in the persisted table). What is wrong, for a `400` naming the field.
pub fn validate_session(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("must not be empty (omit it for no session)".into());
    }
    let chars = key.chars().count();
    if chars > MAX_SESSION_CHARS {
        return Err(format!(
            "is {chars} characters long; at most {MAX_SESSION_CHARS} are accepted"
        ));
    }
    if key.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

struct Binding {
    proxy: ProxyKey,
    /// When it was last used: the larger, the more recently.
    seq: u64,
}

/// Session → proxy bindings; past the capacity, one unused the longest is forgotten.
///
/// Each session is in `order` once, with the `seq` it had when it was queued (its first use,
/// or when an eviction last passed it). A use only moves the binding's `seq`: a grant touches
/// one map entry and queues nothing (a queue entry per use, cleaned by a pass that looked each
/// entry up again, cost two lookups in a million-entry map per grant: docs/performance.md).
/// An eviction pops from the front: a session not used since it was queued is forgotten; one
/// used since goes to the back with its last use (a second chance, as CLOCK page replacement
/// does). So the session forgotten was unused since it was queued, and every session queued
/// before it was used since: the least recently used, to within one pass of the queue. Each
/// use causes at most one requeue, so a bind is O(1) amortized.
pub(crate) struct Sessions {
    bound: FastMap<Digest, Binding>,
    order: VecDeque<(u64, Digest)>,
    next: u64,
    capacity: usize,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::with_capacity(MAX_SESSIONS)
    }
}

impl Sessions {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Sessions {
            bound: FastMap::default(),
            order: VecDeque::new(),
            next: 0,
            capacity: capacity.max(1),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.bound.len()
    }

    pub(crate) fn proxy_of(&self, session: &Digest) -> Option<&ProxyKey> {
        self.bound.get(session).map(|b| &b.proxy)
    }

    /// Binds `session` to `proxy` (or keeps the binding), as the most recently used.
    pub(crate) fn bind(&mut self, session: Digest, proxy: &ProxyKey) {
        let seq = self.next;
        self.next += 1;
        if let Some(binding) = self.bound.get_mut(&session) {
            binding.seq = seq;
            if binding.proxy != *proxy {
                binding.proxy = proxy.clone();
            }
            return;
        }
        // Room first, so the new session is never the one forgotten.
        while self.bound.len() >= self.capacity {
            let Some((queued, oldest)) = self.order.pop_front() else {
                break;
            };
            match self.bound.get(&oldest) {
                Some(binding) if binding.seq == queued => {
                    self.bound.remove(&oldest);
                }
                Some(binding) => self.order.push_back((binding.seq, oldest)),
                // Forgotten already (its proxy was deleted).
                None => {}
            }
        }
        self.bound.insert(
            session,
            Binding {
                proxy: proxy.clone(),
                seq,
            },
        );
        self.order.push_back((seq, session));
    }

    /// Drops the queue entries of sessions no longer bound.
    fn drop_forgotten(&mut self) {
        let bound = &self.bound;
        self.order
            .retain(|(_, session)| bound.contains_key(session));
    }

    /// Forgets the bindings to proxies `keep` refuses (deleted proxies).
    pub(crate) fn retain_proxies(&mut self, keep: impl Fn(&ProxyKey) -> bool) -> bool {
        if self.bound.is_empty() {
            return false;
        }
        let before = self.bound.len();
        self.bound.retain(|_, b| keep(&b.proxy));
        let changed = before != self.bound.len();
        if changed {
            self.drop_forgotten();
        }
        changed
    }

    /// The persisted form: proxy (`namespace/name`) → session digests (hex), least recently
    /// used first.
    #[cfg(test)]
    pub(crate) fn to_snapshot(&self) -> BTreeMap<String, Vec<String>> {
        let mut by_use: Vec<(&Digest, &Binding)> = self.bound.iter().collect();
        by_use.sort_by_key(|(_, binding)| binding.seq);
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (digest, binding) in by_use {
            out.entry(binding.proxy.to_string())
                .or_default()
                .push(hex::encode(digest));
        }
        out
    }

    /// Loads the persisted form; entries that do not parse are skipped.
    pub(crate) fn restore(&mut self, persisted: BTreeMap<String, Vec<String>>) {
        for (proxy, digests) in persisted {
            let Some(proxy) = ProxyKey::parse(&proxy) else {
                continue;
            };
            for text in digests {
                let mut session = [0; 16];
                if hex::decode_to_slice(&text, &mut session).is_ok() {
                    self.bind(session, &proxy);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ProxyKey {
        ProxyKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn session_keys_are_checked() {
        for (key, ok) in [
            ("jar-1", true),
            ("ünïcode ok", true),
            (&"k".repeat(MAX_SESSION_CHARS), true),
            (&"k".repeat(MAX_SESSION_CHARS + 1), false),
            // Characters, not bytes: 256 of them in 768 bytes.
            (&"ü".repeat(MAX_SESSION_CHARS), true),
            (&"ü".repeat(MAX_SESSION_CHARS + 1), false),
            ("", false),
            ("tab\there", false),
            ("nul\0", false),
        ] {
            assert_eq!(validate_session(key).is_ok(), ok, "{key:?}");
        }
    }

    #[test]
    fn the_least_recently_used_session_is_forgotten_first() {
        const MAX_SESSIONS: usize = 4096;
        let mut sessions = Sessions::with_capacity(MAX_SESSIONS);
        for i in 0..MAX_SESSIONS {
            sessions.bind(digest(format!("s{i}").as_bytes()), &key("a"));
        }
        // s0 is used again: s1 is now the oldest.
        sessions.bind(digest(b"s0"), &key("b"));
        sessions.bind(digest(b"one more"), &key("c"));
        assert_eq!(sessions.len(), MAX_SESSIONS);
        assert_eq!(sessions.proxy_of(&digest(b"s0")), Some(&key("b")));
        assert_eq!(sessions.proxy_of(&digest(b"s1")), None);
        assert_eq!(sessions.order.len(), MAX_SESSIONS);
    }

    /// A use queues nothing: a few sessions used millions of times are a few queue entries.
    /// Past the capacity, sessions used since they were queued get a second chance; the one
    /// forgotten is one not used since it was queued.
    #[test]
    fn sessions_used_again_outlive_sessions_used_once() {
        const MAX_SESSIONS: usize = 4096;
        let mut sessions = Sessions::with_capacity(MAX_SESSIONS);
        for i in 0..100_000 {
            sessions.bind(digest(format!("s{}", i % 3).as_bytes()), &key("a"));
        }
        assert_eq!(sessions.len(), 3);
        assert_eq!(sessions.order.len(), 3);
        for i in 0..MAX_SESSIONS - 3 {
            sessions.bind(digest(format!("new{i}").as_bytes()), &key("b"));
        }
        sessions.bind(digest(b"one more"), &key("c"));
        for used_again in ["s0", "s1", "s2"] {
            assert_eq!(
                sessions.proxy_of(&digest(used_again.as_bytes())),
                Some(&key("a")),
                "{used_again}"
            );
        }
        assert_eq!(sessions.proxy_of(&digest(b"new0")), None);
        assert_eq!(sessions.proxy_of(&digest(b"one more")), Some(&key("c")));
        assert_eq!(sessions.len(), MAX_SESSIONS);
        assert_eq!(sessions.order.len(), MAX_SESSIONS);
        let snapshot = sessions.to_snapshot();
        assert_eq!(snapshot.values().map(Vec::len).sum::<usize>(), MAX_SESSIONS);
    }

    /// Every session used since it was queued: the new one is kept and one of the others is
    /// forgotten (the first queued, each having had its second chance).
    #[test]
    fn a_new_session_is_never_the_one_forgotten() {
        let mut sessions = Sessions::with_capacity(3);
        for name in ["a", "b", "c", "b", "a", "c"] {
            sessions.bind(digest(name.as_bytes()), &key(name));
        }
        sessions.bind(digest(b"d"), &key("d"));
        assert_eq!(sessions.proxy_of(&digest(b"d")), Some(&key("d")));
        assert_eq!(sessions.proxy_of(&digest(b"a")), None);
        assert_eq!(sessions.proxy_of(&digest(b"b")), Some(&key("b")));
        assert_eq!(sessions.len(), 3);
        // Hostile: a million new sessions through a table of 3 stays 3 entries and 3 queued.
        for i in 0..1_000_000u32 {
            sessions.bind(digest(&i.to_le_bytes()), &key("e"));
        }
        assert_eq!((sessions.len(), sessions.order.len()), (3, 3));
    }

    #[test]
    fn bindings_survive_their_persisted_form_and_deleted_proxies_are_forgotten() {
        let mut sessions = Sessions::default();
        sessions.bind(digest(b"x"), &key("a"));
        sessions.bind(digest(b"y"), &key("b"));
        let mut restored = Sessions::default();
        restored.restore(sessions.to_snapshot());
        assert_eq!(restored.proxy_of(&digest(b"x")), Some(&key("a")));
        assert!(restored.retain_proxies(|k| &*k.name != "a"));
        assert_eq!(restored.proxy_of(&digest(b"x")), None);
        assert_eq!(restored.proxy_of(&digest(b"y")), Some(&key("b")));
        assert_eq!(restored.order.len(), 1);
    }
}
