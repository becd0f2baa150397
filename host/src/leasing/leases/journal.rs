//! The lease table's persisted form as changes: what one grant, renewal, end or block changes in
//! the table's hard state, as a line of a journal segment, and how segments replay onto a
//! checkpoint. Pure: no I/O here (persist.rs writes and reads the objects).
//!
//! Why changes and not the table: etcd keeps every revision of an object whole, so rewriting a
//! table of N leases at every grant writes O(N) bytes per grant into etcd (a fleet of crawlers
//! filled a 2 GiB etcd in minutes that way). A change is O(1): a grant's line carries that
//! grant. The checkpoint, written rarely (when the journal since the last one is as large as
//! the table), keeps replay and the number of objects short.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::store::keys::ProxyKey;
use super::store::records::{Lease, Snapshot};

/// One change of the table's hard state. Each carries absolute values (an end, a count, a
/// deadline), never a delta: replaying a change twice, or onto a checkpoint that already holds
/// it, gives the same table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Change {
    /// A new lease.
    #[serde(rename = "g")]
    Granted(Lease),
    /// A lease's new end and lifetime.
    #[serde(rename = "r")]
    Renewed {
        id: String,
        #[serde(rename = "x")]
        expires_at_ms: u64,
        #[serde(rename = "t")]
        ttl_ms: u64,
    },
    /// A lease ended before its expiry (released, blocked, its proxy gone or unhealthy). An
    /// expiry needs no line: a restore drops what has expired.
    #[serde(rename = "e")]
    Ended(String),
    /// A proxy cools down for every target until then (ms).
    #[serde(rename = "c")]
    CooledDown(ProxyKey, u64),
    /// A proxy cools down for one target (digest, hex) until then (ms).
    #[serde(rename = "t")]
    CooledDownFor(ProxyKey, String, u64),
    /// A proxy's count of `blocked` reports.
    #[serde(rename = "b")]
    Blocked(ProxyKey, u32),
}

/// The lines of one journal segment (one JSON document per line).
pub fn encode(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| serde_json::to_string(c).expect("a change always serializes"))
        .collect()
}

/// Splits lines into segments of at most `max_bytes` each (a line longer than that is a
/// segment of its own: no change is split).
pub fn into_segments(lines: Vec<String>, max_bytes: usize) -> Vec<String> {
    let mut segments = Vec::new();
    let mut current = String::new();
    for line in lines {
        if !current.is_empty() && current.len() + line.len() + 1 > max_bytes {
            segments.push(std::mem::take(&mut current));
        }
        current.push_str(&line);
        current.push('\n');
    }
    if !current.is_empty() {
        segments.push(current);
    }
    segments
}

/// Splits a checkpoint's text into parts of at most `max_bytes`, at character boundaries.
pub fn into_parts(text: &str, max_bytes: usize) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = rest.len().min(max_bytes.max(4));
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let (part, tail) = rest.split_at(end);
        parts.push(part);
        rest = tail;
    }
    parts
}

/// A table being rebuilt: a checkpoint with segments replayed onto it.
#[derive(Debug, Default)]
pub struct Replay {
    leases: BTreeMap<String, Lease>,
    cooldowns: BTreeMap<String, u64>,
    target_cooldowns: BTreeMap<String, BTreeMap<String, u64>>,
    blocked_reports: BTreeMap<String, u32>,
    /// Legacy tables (one ConfigMap key) carried sessions; kept as read.
    sessions: BTreeMap<String, Vec<String>>,
    /// Lines that did not parse (logged by the caller).
    pub skipped: usize,
}

impl Replay {
    pub fn from_checkpoint(snapshot: Snapshot) -> Self {
        Replay {
            leases: snapshot
                .leases
                .into_iter()
                .map(|l| (l.id.clone(), l))
                .collect(),
            cooldowns: snapshot.cooldowns,
            target_cooldowns: snapshot.target_cooldowns,
            blocked_reports: snapshot.blocked_reports,
            sessions: snapshot.sessions,
            skipped: 0,
        }
    }

    /// Applies one segment's lines, in order.
    pub fn apply_segment(&mut self, text: &str) {
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match serde_json::from_str::<Change>(line) {
                Ok(change) => self.apply(change),
                Err(_) => self.skipped += 1,
            }
        }
    }

    pub fn apply(&mut self, change: Change) {
        match change {
            Change::Granted(lease) => {
                self.leases.insert(lease.id.clone(), lease);
            }
            Change::Renewed {
                id,
                expires_at_ms,
                ttl_ms,
            } => {
                if let Some(lease) = self.leases.get_mut(&id) {
                    lease.expires_at_ms = expires_at_ms;
                    lease.ttl_ms = ttl_ms;
                }
            }
            Change::Ended(id) => {
                self.leases.remove(&id);
            }
            Change::CooledDown(proxy, until) => {
                let end = self.cooldowns.entry(proxy.to_string()).or_default();
                *end = (*end).max(until);
            }
            Change::CooledDownFor(proxy, target, until) => {
                let end = self
                    .target_cooldowns
                    .entry(proxy.to_string())
                    .or_default()
                    .entry(target)
                    .or_default();
                *end = (*end).max(until);
            }
            Change::Blocked(proxy, count) => {
                self.blocked_reports.insert(proxy.to_string(), count);
            }
        }
    }

    pub fn into_snapshot(self) -> Snapshot {
        Snapshot {
            leases: self.leases.into_values().collect(),
            cooldowns: self.cooldowns,
            target_cooldowns: self.target_cooldowns,
            sessions: self.sessions,
            blocked_reports: self.blocked_reports,
        }
    }
}

/// When the journal is folded into a new checkpoint: once it holds as many bytes as the last
/// checkpoint (so a checkpoint's cost, spread over the grants since the last, is at most one
/// more line per grant), but not for a tiny table before `min_bytes`, and always past
/// `max_segments` (restore reads each segment).
pub fn checkpoint_due(
    journal_bytes: usize,
    journal_segments: usize,
    last_checkpoint_bytes: usize,
    min_bytes: usize,
    max_segments: usize,
) -> bool {
    journal_segments > 0
        && (journal_segments >= max_segments
            || journal_bytes >= last_checkpoint_bytes.max(min_bytes))
}

/// A journal segment's sequence number from its object name (`<table>-j-<seq>`).
pub fn segment_seq(table: &str, object_name: &str) -> Option<u64> {
    object_name
        .strip_prefix(table)?
        .strip_prefix("-j-")?
        .parse()
        .ok()
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

    fn lease(id: &str, proxy: &str, expires_at_ms: u64) -> Lease {
        Lease {
            id: id.into(),
            proxy: key(proxy),
            granted_at_ms: 1,
            expires_at_ms,
            session: Some("jar".into()),
            pool: Some("web".into()),
            provider: "memory".into(),
            ttl_ms: 300_000,
            holder: Some("system:serviceaccount:crawl:bot".into()),
        }
    }

    #[test]
    fn changes_replay_onto_a_checkpoint_and_twice_is_the_same_as_once() {
        let checkpoint = Snapshot {
            leases: vec![lease("a", "p1", 100), lease("b", "p2", 100)],
            ..Default::default()
        };
        let changes = vec![
            Change::Granted(lease("c", "p3", 200)),
            Change::Renewed {
                id: "a".into(),
                expires_at_ms: 500,
                ttl_ms: 400,
            },
            Change::Ended("b".into()),
            Change::CooledDown(key("p2"), 900),
            Change::CooledDownFor(key("p3"), "ab".repeat(16), 800),
            Change::Blocked(key("p2"), 3),
            Change::Renewed {
                id: "gone".into(),
                expires_at_ms: 1,
                ttl_ms: 1,
            },
        ];
        let text = into_segments(encode(&changes), 1 << 20).concat();
        let once = {
            let mut replay = Replay::from_checkpoint(checkpoint.clone());
            replay.apply_segment(&text);
            replay.into_snapshot()
        };
        let twice = {
            let mut replay = Replay::from_checkpoint(once.clone());
            replay.apply_segment(&text);
            replay.into_snapshot()
        };
        assert_eq!(once, twice);
        let ids: Vec<(&str, u64)> = once
            .leases
            .iter()
            .map(|l| (l.id.as_str(), l.expires_at_ms))
            .collect();
        assert_eq!(ids, [("a", 500), ("c", 200)]);
        assert_eq!(once.cooldowns["ns/p2"], 900);
        assert_eq!(once.target_cooldowns["ns/p3"][&"ab".repeat(16)], 800);
        assert_eq!(once.blocked_reports["ns/p2"], 3);
    }

    #[test]
    fn a_damaged_line_is_skipped_and_the_rest_applies() {
        let mut replay = Replay::default();
        let good = encode(&[Change::Granted(lease("a", "p1", 100))]).concat();
        replay.apply_segment(&format!("{{not json\n{good}\n\n"));
        assert_eq!(replay.skipped, 1);
        assert_eq!(replay.into_snapshot().leases.len(), 1);
    }

    /// What issue #30 asks of sync mode: a grant writes its own line, not the table. A grant's
    /// line with a session, a pool and a holder is a few hundred bytes, whatever the table holds.
    #[test]
    fn a_grants_line_is_small_and_segments_stay_under_their_bound() {
        let line = &encode(&[Change::Granted(lease(&"f".repeat(32), "proxy-7f3kq", 1))])[0];
        assert!(line.len() < 400, "{} bytes: {line}", line.len());
        let lines: Vec<String> = (0..10_000).map(|_| line.clone()).collect();
        let segments = into_segments(lines, 256 * 1024);
        assert!(segments.iter().all(|s| s.len() <= 256 * 1024));
        assert_eq!(
            segments.iter().map(|s| s.lines().count()).sum::<usize>(),
            10_000
        );
    }

    #[test]
    fn parts_split_at_character_boundaries_and_join_again() {
        let text = "añb€c".repeat(1000);
        for max in [4, 5, 7, 100, 1 << 20] {
            let parts = into_parts(&text, max);
            assert!(parts.iter().all(|p| p.len() <= max.max(4)), "{max}");
            assert_eq!(parts.concat(), text);
        }
        assert!(into_parts("", 10).is_empty());
    }

    #[test]
    fn when_a_checkpoint_is_due() {
        const MIN: usize = 256 * 1024;
        for (bytes, segments, last, due) in [
            (0, 0, 0, false),
            (10, 1, 0, false),
            (MIN, 3, 0, true),
            (MIN, 3, 4 * MIN, false),
            (4 * MIN, 3, 4 * MIN, true),
            (10, 512, 4 * MIN, true),
        ] {
            assert_eq!(
                checkpoint_due(bytes, segments, last, MIN, 512),
                due,
                "{bytes} {segments} {last}"
            );
        }
    }

    #[test]
    fn segment_names_carry_their_sequence() {
        assert_eq!(
            segment_seq("po-leases", "po-leases-j-000000000042"),
            Some(42)
        );
        assert_eq!(segment_seq("po-leases", "po-leases-c3-0"), None);
        assert_eq!(segment_seq("po-leases", "other-j-1"), None);
    }
}
