//! `kubectl px status POOL` and `status PROXY`: one object on one screen, and whether it is
//! Ready (exit code 3 when not). Pure.

use kube::ResourceExt;
use serde::Serialize;

use super::fleet::{
    BlockRow, Fleet, PoolRow, ProviderRow, ProxyRow, block_rows, blocks_table, lease_state,
    phase_text, phase_tone, pool_row, provider_row, proxies_table, proxy_row, qualified_name,
};
use super::table::{Tone, age, bold, paint, relative};
use crate::api::labels::POOL_LABEL;
use crate::api::{Phase, ProviderHealth, Proxy, ProxyPool};
use crate::support::printable::printable;

/// A condition as shown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConditionView {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

fn conditions_of(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Vec<ConditionView> {
    conditions
        .iter()
        .map(|c| ConditionView {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolView {
    pub pool: PoolRow,
    pub ready: bool,
    pub conditions: Vec<ConditionView>,
    pub proxies: Vec<ProxyRow>,
    pub blocks: Vec<BlockRow>,
    pub notes: Vec<String>,
}

/// A pool is Ready when its `Ready` condition says so and every replica it wants is Ready.
pub fn pool_view(pool: &ProxyPool, fleet: &Fleet) -> PoolView {
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let members: Vec<Proxy> = fleet
        .proxies
        .iter()
        .filter(|p| {
            p.namespace().as_deref() == Some(namespace.as_str())
                && p.labels().get(POOL_LABEL) == Some(&name)
        })
        .cloned()
        .collect();
    let row = pool_row(pool, fleet);
    let conditions = conditions_of(&pool.status.clone().unwrap_or_default().conditions);
    let ready = row.ready >= row.desired
        && conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
    let scoped = Fleet {
        proxies: members,
        ..fleet.clone()
    };
    let mut proxies: Vec<ProxyRow> = scoped
        .proxies
        .iter()
        .map(|p| proxy_row(p, &fleet.leases))
        .collect();
    proxies.sort_by(|a, b| a.name.cmp(&b.name));
    let mut blocks = block_rows(&scoped);
    blocks.sort_by(|a, b| a.name.cmp(&b.name));
    PoolView {
        pool: row,
        ready,
        conditions,
        proxies,
        blocks,
        notes: notes(fleet),
    }
}

fn notes(fleet: &Fleet) -> Vec<String> {
    fleet
        .leases
        .unreadable
        .iter()
        .map(|why| {
            format!("the lease table could not be read ({why}): leases and cooldowns are not shown")
        })
        .collect()
}

/// `label:` padded so the values line up; `value` without its control characters (its parts
/// are a plugin's or the cluster's words: [`printable`]).
fn field(out: &mut String, label: &str, value: &str, colour: bool) {
    painted_field(out, &printable(label), &printable(value), colour)
}

/// As [`field`], for a value whose parts were made [`printable`] before [`paint`] coloured them.
fn painted_field(out: &mut String, label: &str, value: &str, colour: bool) {
    out.push_str(&format!(
        "{}{}{value}\n",
        bold(&format!("{label}:"), colour),
        " ".repeat(13usize.saturating_sub(label.len() + 1).max(1))
    ));
}

fn conditions_text(out: &mut String, conditions: &[ConditionView], colour: bool) {
    for c in conditions {
        let tone = match (c.type_.as_str(), c.status.as_str()) {
            // The one condition whose `True` is the trouble: a cap holds the pool back.
            (crate::api::conditions::CAP_REACHED, "True") => Tone::Warn,
            (crate::api::conditions::CAP_REACHED, _) => Tone::Good,
            (_, "True") => Tone::Good,
            (_, "False") => Tone::Bad,
            _ => Tone::Warn,
        };
        let message = if c.message.is_empty() {
            String::new()
        } else {
            format!(": {}", printable(&c.message))
        };
        painted_field(
            out,
            &printable(&c.type_),
            &format!(
                "{} {}{message}",
                paint(&printable(&c.status), tone, colour),
                printable(&c.reason)
            ),
            colour,
        );
    }
}

pub fn render_pool(view: &PoolView, now_ms: u64, colour: bool) -> String {
    let p = &view.pool;
    let mut out = String::new();
    field(
        &mut out,
        "Pool",
        &qualified_name(&p.namespace, &p.name),
        colour,
    );
    field(
        &mut out,
        "Replicas",
        &format!(
            "{} desired, {} ready, {} leased, {} cooling down, {} draining, {} up to date",
            p.desired, p.ready, p.leased, p.cooling, p.draining, p.up_to_date
        ),
        colour,
    );
    field(&mut out, "Provider", &p.provider, colour);
    field(
        &mut out,
        "Age",
        &p.created_ms.map_or("-".into(), |c| age(c, now_ms)),
        colour,
    );
    conditions_text(&mut out, &view.conditions, colour);
    out.push('\n');
    if view.proxies.is_empty() {
        out.push_str("No Proxies yet.\n");
    } else {
        out.push_str(
            &proxies_table(&view.proxies, now_ms)
                .without_first_column()
                .render(colour),
        );
    }
    if !view.blocks.is_empty() {
        out.push('\n');
        out.push_str(
            &blocks_table(&view.blocks, None, now_ms)
                .without_first_column()
                .render(colour),
        );
    }
    for note in &view.notes {
        out.push_str(&format!("\nNote: {}\n", printable(note)));
    }
    out
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyView {
    pub proxy: ProxyRow,
    pub ready: bool,
    pub conditions: Vec<ConditionView>,
    pub last_error: Option<String>,
    pub last_probe: Option<String>,
    pub last_probe_latency_ms: Option<u32>,
    pub provider_health: Option<ProviderRow>,
    pub targets_cooling_down: usize,
    pub notes: Vec<String>,
}

/// A Proxy is Ready in phase `Ready` (what the discovery API leases from).
pub fn proxy_view(proxy: &Proxy, health: Option<&ProviderHealth>, fleet: &Fleet) -> ProxyView {
    let row = proxy_row(proxy, &fleet.leases);
    let status = proxy.status.clone().unwrap_or_default();
    let key = qualified_name(&row.namespace, &row.name);
    ProxyView {
        ready: row.phase == Some(Phase::Ready),
        conditions: conditions_of(&status.conditions),
        last_error: status.last_error.clone(),
        last_probe: status
            .last_probe_time
            .as_ref()
            .map(|t| super::table::rfc3339(super::table::millis(t))),
        last_probe_latency_ms: status.last_probe_latency_ms,
        provider_health: health.map(provider_row),
        targets_cooling_down: fleet.leases.targets_cooling(&key).0,
        notes: notes(fleet),
        proxy: row,
    }
}

/// `none`, or the reports and cooldowns of the lease table.
fn blocks_text(view: &ProxyView, now_ms: u64) -> String {
    let p = &view.proxy;
    let mut parts = Vec::new();
    if p.blocked_reports > 0 {
        parts.push(format!("{} blocked report(s)", p.blocked_reports));
    }
    if let Some(until) = p.cooling_down_until_ms {
        parts.push(format!(
            "cooling down for every target, leasable again {}",
            relative(until, now_ms)
        ));
    }
    if view.targets_cooling_down > 0 {
        parts.push(format!(
            "cooling down for {} target(s)",
            view.targets_cooling_down
        ));
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join("; ")
    }
}

pub fn render_proxy(view: &ProxyView, now_ms: u64, colour: bool) -> String {
    let p = &view.proxy;
    let mut out = String::new();
    let dash = |v: Option<&str>| v.unwrap_or("-").to_string();
    field(
        &mut out,
        "Proxy",
        &qualified_name(&p.namespace, &p.name),
        colour,
    );
    painted_field(
        &mut out,
        "Phase",
        &paint(&phase_text(p.phase), phase_tone(p.phase), colour),
        colour,
    );
    let health = view.provider_health.as_ref().map_or(
        " (no ProviderHealth: not in the providers config?)".to_string(),
        |h| {
            format!(
                " (check: {} {}; plugin: {})",
                dash(h.ready.as_deref()),
                dash(h.reason.as_deref()),
                dash(h.plugin.as_deref())
            )
        },
    );
    field(
        &mut out,
        "Provider",
        &format!("{}{health}", p.provider),
        colour,
    );
    field(&mut out, "Pool", &dash(p.pool.as_deref()), colour);
    field(
        &mut out,
        "Age",
        &p.created_ms.map_or("-".into(), |c| age(c, now_ms)),
        colour,
    );
    field(&mut out, "Address", &dash(p.address.as_deref()), colour);
    field(&mut out, "Exit IP", &dash(p.exit_ip.as_deref()), colour);
    let lease = match &p.lease {
        Some(l) => format!(
            "held by {}{}, expires {}",
            l.holder,
            l.session
                .as_ref()
                .map(|s| format!(" (session {s})"))
                .unwrap_or_default(),
            relative(l.expires_at_ms, now_ms)
        ),
        None => lease_state(p, now_ms).text,
    };
    field(&mut out, "Lease", &lease, colour);
    field(&mut out, "Blocks", &blocks_text(view, now_ms), colour);
    field(
        &mut out,
        "Last probe",
        &match (&view.last_probe, view.last_probe_latency_ms) {
            (Some(at), Some(ms)) => format!("{at} ({ms} ms)"),
            (Some(at), None) => at.clone(),
            _ => "-".into(),
        },
        colour,
    );
    if let Some(error) = &view.last_error {
        field(&mut out, "Last error", error, colour);
    }
    conditions_text(&mut out, &view.conditions, colour);
    for note in &view.notes {
        out.push_str(&format!("\nNote: {}\n", printable(note)));
    }
    out
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::*;
    use crate::faces::kubectl::fleet::tests::proxy;
    use crate::faces::kubectl::lease_table::LeaseFacts;

    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn one_proxy_reads_top_to_bottom() {
        let stuck = proxy(
            "stuck",
            None,
            json!({"phase": "Pending", "lastError": "Create: quota: HTTP 429: full",
                   "conditions": [{"type": "Provisioned", "status": "False", "reason": "Quota",
                                   "message": "Create at provider store: quota: HTTP 429: full; retrying",
                                   "lastTransitionTime": "2027-01-15T08:00:00Z"}]}),
        );
        let fleet = Fleet {
            now_ms: NOW,
            ..Default::default()
        };
        let view = proxy_view(&stuck, None, &fleet);
        assert!(!view.ready);
        let text = render_proxy(&view, NOW, false);
        let expected = "\
Proxy:       crawl/stuck
Phase:       Pending
Provider:    store (no ProviderHealth: not in the providers config?)
Pool:        -
Age:         5m
Address:     -
Exit IP:     -
Lease:       -
Blocks:      none
Last probe:  -
Last error:  Create: quota: HTTP 429: full
Provisioned: False Quota: Create at provider store: quota: HTTP 429: full; retrying
";
        assert_eq!(text, expected, "\n{text}");
        // `-o yaml` is the same value as `-o json`, read back by a YAML reader.
        let yaml = crate::support::yaml::to_string(&view).unwrap();
        assert_eq!(
            crate::support::yaml::from_str::<serde_json::Value>(&yaml).unwrap(),
            serde_json::to_value(&view).unwrap(),
            "{yaml}"
        );
    }

    /// `CapReached` is the condition whose `True` is the trouble: shown in the warning colour,
    /// with the instance and the figure.
    #[test]
    fn a_capped_pool_shows_its_cap_as_a_warning() {
        let pool: ProxyPool = serde_json::from_value(json!({
            "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": "egress", "namespace": "crawl"},
            "spec": {"replicas": 5, "template": {"spec": {"provider": "gcp-eu"}}},
            "status": {"replicas": 3, "readyReplicas": 3, "conditions": [
                {"type": "CapReached", "status": "True", "reason": "ProviderCapReached",
                 "message": "provider instance gcp-eu is at its cap of 3 Proxies (limits.maxProxies); 3 of 5 replicas made",
                 "lastTransitionTime": "2027-01-15T08:00:00Z"}]},
        }))
        .unwrap();
        let fleet = Fleet {
            now_ms: NOW,
            ..Default::default()
        };
        let text = render_pool(&pool_view(&pool, &fleet), NOW, true);
        assert!(
            text.contains("\x1b[33mTrue\x1b[0m ProviderCapReached: provider instance gcp-eu is at its cap of 3 Proxies"),
            "{text:?}"
        );
    }

    #[test]
    fn a_pool_is_ready_only_with_every_replica_ready() {
        let pool: ProxyPool = serde_json::from_value(json!({
            "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": "egress", "namespace": "crawl"},
            "spec": {"replicas": 2, "template": {"spec": {"provider": "store"}}},
            "status": {"replicas": 2, "readyReplicas": 1,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "PoolReady",
                                       "message": "", "lastTransitionTime": "2027-01-15T08:00:00Z"}]},
        }))
        .unwrap();
        let fleet = Fleet {
            proxies: vec![
                proxy("egress-a", Some("egress"), json!({"phase": "Ready"})),
                proxy("other", None, json!({"phase": "Ready"})),
            ],
            leases: LeaseFacts::unreadable("forbidden".into()),
            now_ms: NOW,
            ..Default::default()
        };
        let view = pool_view(&pool, &fleet);
        assert!(!view.ready, "1 of 2 Ready");
        assert_eq!(view.proxies.len(), 1, "only its members");
        let text = render_pool(&view, NOW, false);
        assert!(
            text.starts_with("Pool:        crawl/egress\nReplicas:    2 desired, 1 ready, 0 leased, 0 cooling down, 0 draining, 0 up to date\n"),
            "{text}"
        );
        assert!(text.contains("\nReady:       True PoolReady\n"), "{text}");
        assert!(text.contains("\nPROXY      PHASE"), "{text}");
        assert!(
            text.contains("Note: the lease table could not be read (forbidden)"),
            "{text}"
        );
    }

    /// `text` without the SGR sequences `paint` and `bold` add (`ESC [ digits m`), so what is
    /// left of any escape came from somewhere else.
    pub(in crate::faces::kubectl) fn without_own_colours(text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find("\x1b[") {
            out.push_str(&rest[..at]);
            let after = &rest[at + 2..];
            let digits = after
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after.len());
            if digits > 0 && after[digits..].starts_with('m') {
                rest = &after[digits + 1..];
            } else {
                out.push('\x1b');
                rest = &rest[at + 1..];
            }
        }
        out.push_str(rest);
        out
    }

    /// A plugin's message in a Proxy's last error and conditions, and a ProviderHealth's, reach
    /// `kubectl px status` without their control sequences, coloured or not, and the fleet's
    /// tables likewise (docs/security.md, "What a reader is shown").
    #[test]
    fn a_plugins_control_sequences_never_reach_the_terminal() {
        let hostile = "quota\x1b]52;c;Y3VybCBldmlsLnNo\x07 full\u{9b}2J\r\x1b[1Aok";
        let stuck = proxy(
            "stuck",
            None,
            json!({"phase": "Pending", "lastError": hostile, "address": "10.0.0.1\x1b[8m",
                   "conditions": [{"type": "Ready\x1b[0m", "status": "False\x07",
                                   "reason": "Quota\u{202e}", "message": hostile,
                                   "lastTransitionTime": "2027-01-15T08:00:00Z"}]}),
        );
        let health: ProviderHealth = serde_json::from_value(json!({
            "apiVersion": "proxy-operator.dev/v1alpha1", "kind": "ProviderHealth",
            "metadata": {"name": "store"},
            "spec": {"providerType": "test"},
            "status": {"targetsSummary": hostile, "conditions": [
                {"type": "Ready", "status": "False", "reason": "Check\x1b]0;x\x07",
                 "message": hostile, "lastTransitionTime": "2027-01-15T08:00:00Z"},
                {"type": "PluginLoaded", "status": "True", "reason": "Loaded",
                 "message": hostile, "lastTransitionTime": "2027-01-15T08:00:00Z"}]},
        }))
        .unwrap();
        let fleet = Fleet {
            proxies: vec![stuck.clone()],
            providers: vec![health.clone()],
            now_ms: NOW,
            ..Default::default()
        };
        let view = proxy_view(&stuck, Some(&health), &fleet);
        for colour in [false, true] {
            let texts = [
                render_proxy(&view, NOW, colour),
                super::super::fleet::render(&super::super::fleet::view(&fleet), true, NOW, colour),
            ];
            for text in texts {
                let text = without_own_colours(&text);
                assert!(!text.contains("52;c;"), "{text:?}");
                assert!(
                    !text
                        .chars()
                        .any(|c| c.is_control() && c != '\n' || c == '\u{202e}'),
                    "{text:?}"
                );
                assert!(text.contains("quota full ok"), "{text:?}");
            }
        }
    }
}
