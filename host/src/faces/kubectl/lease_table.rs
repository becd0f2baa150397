//! What the operator's lease table says of each proxy, read from its persisted form (the
//! checkpoint with the journal replayed, `leases::persist`): the leader keeps the live table in
//! memory and writes every change there (docs/architecture.md, "Lease state"). Pure: from a
//! `Snapshot` to facts per proxy, live ones only.

use std::collections::BTreeMap;

use serde::Serialize;

use super::table::rfc3339;
use crate::leasing::leases::Snapshot;

/// A live lease as `status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseView {
    /// Who holds it: a ServiceAccount's user name, or `static token`.
    pub holder: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    pub granted_at: String,
    pub expires_at: String,
    #[serde(skip)]
    pub expires_at_ms: u64,
}

/// The table's facts, by proxy (`namespace/name`), as of `now`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeaseFacts {
    /// Why the table could not be read (then every map is empty).
    pub unreadable: Option<String>,
    pub leases: BTreeMap<String, LeaseView>,
    /// Cooling down for every target until then (ms).
    pub cooldowns: BTreeMap<String, u64>,
    /// Cooling down for some targets: target digest (hex) → until (ms).
    pub target_cooldowns: BTreeMap<String, BTreeMap<String, u64>>,
    /// `blocked` reports so far.
    pub blocked: BTreeMap<String, u32>,
}

/// How the holder of a lease granted to the static token reads.
pub const STATIC_TOKEN: &str = "static token";

impl LeaseFacts {
    /// The live part of `snapshot` at `now_ms`: what has expired is what a restore drops too.
    pub fn from_snapshot(snapshot: Snapshot, now_ms: u64) -> Self {
        let leases = snapshot
            .leases
            .into_iter()
            .filter(|l| l.expires_at_ms > now_ms)
            .map(|l| {
                let view = LeaseView {
                    holder: l.holder.clone().unwrap_or_else(|| STATIC_TOKEN.into()),
                    session: l.session.as_deref().map(str::to_string),
                    granted_at: rfc3339(l.granted_at_ms),
                    expires_at: rfc3339(l.expires_at_ms),
                    expires_at_ms: l.expires_at_ms,
                };
                (l.proxy.to_string(), view)
            })
            .collect();
        let target_cooldowns = snapshot
            .target_cooldowns
            .into_iter()
            .map(|(proxy, targets)| {
                let live: BTreeMap<String, u64> = targets
                    .into_iter()
                    .filter(|(_, end)| *end > now_ms)
                    .collect();
                (proxy, live)
            })
            .filter(|(_, live)| !live.is_empty())
            .collect();
        LeaseFacts {
            unreadable: None,
            leases,
            cooldowns: snapshot
                .cooldowns
                .into_iter()
                .filter(|(_, end)| *end > now_ms)
                .collect(),
            target_cooldowns,
            blocked: snapshot
                .blocked_reports
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect(),
        }
    }

    /// No table to show, and why (shown as a note).
    pub fn unreadable(why: String) -> Self {
        LeaseFacts {
            unreadable: Some(why),
            ..Default::default()
        }
    }

    pub fn lease(&self, proxy: &str) -> Option<&LeaseView> {
        self.leases.get(proxy)
    }

    pub fn cooling_until(&self, proxy: &str) -> Option<u64> {
        self.cooldowns.get(proxy).copied()
    }

    /// How many targets `proxy` cools down for, and the latest end.
    pub fn targets_cooling(&self, proxy: &str) -> (usize, Option<u64>) {
        self.target_cooldowns
            .get(proxy)
            .map(|t| (t.len(), t.values().max().copied()))
            .unwrap_or((0, None))
    }

    /// Until when `proxy` cools down for the target of digest `digest`.
    pub fn cooling_for(&self, proxy: &str, digest: &str) -> Option<u64> {
        self.target_cooldowns.get(proxy)?.get(digest).copied()
    }

    pub fn blocked(&self, proxy: &str) -> u32 {
        self.blocked.get(proxy).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::leasing::leases::ProxyKey;
    use crate::leasing::leases::store::Lease;

    const NOW: u64 = 1_800_000_000_000;

    fn lease(proxy: &str, expires: u64, holder: Option<&str>, session: Option<&str>) -> Lease {
        let key = ProxyKey::parse(proxy).unwrap();
        Lease {
            id: format!("{:032x}", expires),
            proxy: key,
            granted_at_ms: NOW - 60_000,
            expires_at_ms: expires,
            session: session.map(Arc::from),
            pool: None,
            provider: "store".into(),
            ttl_ms: 0,
            holder: holder.map(str::to_string),
        }
    }

    /// Only what is live at `now` is a fact: an expired lease or cooldown is what a restore
    /// drops too; the holder reads as a person would say it.
    #[test]
    fn only_live_leases_and_cooldowns_are_facts() {
        let snapshot = Snapshot {
            leases: vec![
                lease("c/live", NOW + 240_000, None, Some("jar-1")),
                lease(
                    "c/sa",
                    NOW + 1,
                    Some("system:serviceaccount:c:crawler"),
                    None,
                ),
                lease("c/gone", NOW, None, None),
            ],
            cooldowns: [("c/cool".into(), NOW + 60_000), ("c/was".into(), NOW - 1)].into(),
            target_cooldowns: [
                (
                    "c/t".into(),
                    [
                        ("aa".into(), NOW + 5),
                        ("bb".into(), NOW + 9),
                        ("cc".into(), NOW - 1),
                    ]
                    .into(),
                ),
                ("c/old".into(), [("aa".into(), NOW - 1)].into()),
            ]
            .into(),
            blocked_reports: [("c/t".into(), 3), ("c/zero".into(), 0)].into(),
            ..Default::default()
        };
        let facts = LeaseFacts::from_snapshot(snapshot, NOW);
        assert_eq!(facts.leases.keys().collect::<Vec<_>>(), ["c/live", "c/sa"]);
        let live = facts.lease("c/live").unwrap();
        assert_eq!(live.holder, STATIC_TOKEN);
        assert_eq!(live.session.as_deref(), Some("jar-1"));
        assert_eq!(
            facts.lease("c/sa").unwrap().holder,
            "system:serviceaccount:c:crawler"
        );
        assert_eq!(facts.cooling_until("c/cool"), Some(NOW + 60_000));
        assert_eq!(facts.cooling_until("c/was"), None);
        assert_eq!(facts.targets_cooling("c/t"), (2, Some(NOW + 9)));
        assert_eq!(facts.targets_cooling("c/old"), (0, None));
        assert_eq!(facts.cooling_for("c/t", "bb"), Some(NOW + 9));
        assert_eq!(facts.cooling_for("c/t", "cc"), None);
        assert_eq!(facts.blocked("c/t"), 3);
        assert_eq!(facts.blocked.len(), 1);
    }
}
