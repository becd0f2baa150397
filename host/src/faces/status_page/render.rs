//! The page as HTML, from a [`Snapshot`] alone (pure: table-tested). One document with inline
//! CSS and a small inline script, nothing loaded from anywhere: the script fetches the fragment
//! (`status/fragment`, the same `<main>` content) every few seconds and swaps it in; without
//! scripting the page is whole as served.

use std::fmt::Write as _;

use super::html::{Cell, Table, esc};
use super::snapshot::{Replica, Snapshot};

/// Seconds between the script's refreshes.
pub const REFRESH_SECONDS: u32 = 5;

const STYLE: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2733;background:#f5f7fa}
header{background:#1d2733;color:#fff;padding:10px 20px;display:flex;gap:24px;align-items:baseline}
header h1{font-size:18px;margin:0}
#live{font-size:12px;color:#b8c4d0}
main{padding:4px 20px 20px}
h2{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0002;margin-bottom:4px}
th,td{padding:4px 10px;text-align:left;border-bottom:1px solid #e3e8ee;white-space:nowrap}
th{background:#eef2f6;font-weight:600;font-size:12px}
td.wrap{white-space:normal}
.summary span{margin-right:14px}
.badge{border-radius:9px;padding:1px 8px;font-size:12px;font-weight:600}
.good{background:#d4f4dd;color:#14632b}.bad{background:#fbd9d9;color:#8b1c1c}
.busy{background:#d8e6fd;color:#1b4b9b}.warn{background:#fdf0cc;color:#7a5300}
.idle{background:#e6e9ed;color:#46505a}
.bar{display:inline-block;height:8px;background:#e25c5c;margin-right:6px;vertical-align:middle;max-width:160px}
.note{color:#5b6773;font-size:12px}
.grid{display:flex;flex-wrap:wrap;gap:0 32px}
";

const SCRIPT: &str = "
(function(){
var main=document.getElementById('status'),live=document.getElementById('live'),n=0;
function refresh(){
fetch('status/fragment',{cache:'no-store'}).then(function(r){
if(!r.ok){throw new Error('HTTP '+r.status);}return r.text();
}).then(function(html){
main.innerHTML=html;n+=1;main.setAttribute('data-refreshes',String(n));
live.textContent='live: refreshed '+new Date().toLocaleTimeString();
}).catch(function(e){live.textContent='refresh failed ('+e.message+'); retrying';});
}
live.textContent='live: refreshing every SECONDS s';
setInterval(refresh,SECONDS*1000);
})();
";

const ON_THE_LEADER: &str =
    "<p class=\"note\" id=\"ID\">Counted by the leader: see its page or /metrics.</p>";

/// The whole page.
pub fn page(snapshot: &Snapshot) -> String {
    let script = SCRIPT.replace("SECONDS", &REFRESH_SECONDS.to_string());
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>proxy-operator status</title><style>{STYLE}</style></head>\
         <body><header><h1>proxy-operator</h1><span id=\"live\">a snapshot; reload for a newer one</span></header>\
         <main id=\"status\" data-refreshes=\"0\">{}</main><script>{script}</script></body></html>\n",
        fragment(snapshot)
    )
}

/// The `<main>` content, also served alone for the script's refresh.
pub fn fragment(s: &Snapshot) -> String {
    let mut html = String::new();
    html.push_str(&summary(s));
    html.push_str("<h2>Pools</h2>");
    html.push_str(&pools(s));
    html.push_str("<h2>Providers</h2>");
    html.push_str(&providers(s));
    html.push_str("<h2>Proxies</h2>");
    html.push_str(&proxies(s));
    html.push_str("<h2>Leases</h2>");
    html.push_str(&leases(s));
    html.push_str("<div class=\"grid\"><div><h2>Blocks per target, last hour</h2>");
    // Blocks, leases and the meter are the leader's: a standby's own counts are empty.
    let leader = s.replica == Replica::Leader;
    html.push_str(&if leader {
        blocks(s)
    } else {
        ON_THE_LEADER.replace("ID", "blocks")
    });
    html.push_str("</div><div><h2>Usage</h2>");
    html.push_str(&if leader {
        super::render_usage::usage(&s.usage)
    } else {
        ON_THE_LEADER.replace("ID", "usage")
    });
    html.push_str("</div></div><h2>Plugins</h2>");
    html.push_str(&plugins(s));
    html
}

fn summary(s: &Snapshot) -> String {
    let replica = match &s.replica {
        Replica::Leader => "the leader".to_string(),
        Replica::Standby { leader: Some(l) } => format!("a standby (the leader is {})", esc(l)),
        Replica::Standby { leader: None } => "a standby (no replica leads yet)".to_string(),
        Replica::Starting => "starting".to_string(),
    };
    let total: usize = s.phases.iter().map(|(_, n)| n).sum();
    let mut html = format!(
        "<p class=\"summary\" id=\"summary\"><span>This replica is <b id=\"replica\">{replica}</b>.</span>\
         <span>Proxies: <b id=\"proxies-total\">{total}</b></span>"
    );
    for (phase, n) in &s.phases {
        let _ = write!(
            html,
            "<span>{} <b data-phase=\"{}\">{n}</b></span>",
            Cell::badge(phase).into_html(),
            esc(phase)
        );
    }
    let _ = write!(
        html,
        "<span class=\"note\">as of {}</span></p>",
        esc(&s.generated_at)
    );
    html
}

fn pools(s: &Snapshot) -> String {
    if s.pools.is_empty() {
        return "<p class=\"note\">No ProxyPool.</p>".into();
    }
    let mut table = Table::new(
        "pools",
        &["Pool", "Desired", "Ready", "Leased", "Cooling", "Draining"],
    );
    for p in &s.pools {
        table.row([
            Cell::text(&format!("{}/{}", p.namespace, p.name)),
            Cell::number(p.desired),
            Cell::number(p.ready),
            Cell::number(p.leased),
            p.cooling
                .map_or_else(|| Cell::text("on the leader"), Cell::number),
            Cell::number(p.draining),
        ]);
    }
    table.finish()
}

fn providers(s: &Snapshot) -> String {
    if s.providers.is_empty() {
        return "<p class=\"note\">No ProviderHealth yet.</p>".into();
    }
    let mut table = Table::new(
        "providers",
        &[
            "Provider", "Type", "Health", "Reason", "Targets", "Checked", "Message",
        ],
    );
    for p in &s.providers {
        let health = match p.ready {
            Some(true) => "ok",
            Some(false) => "failing",
            None => "unknown",
        };
        table.row([
            Cell::text(&p.name),
            Cell::text(&p.provider_type),
            Cell::badge(health),
            Cell::text(&p.reason),
            Cell::text(&p.targets),
            Cell::text(&p.last_check),
            Cell::short(&p.message, 80),
        ]);
    }
    table.finish()
}

fn proxies(s: &Snapshot) -> String {
    if s.proxies.is_empty() {
        return "<p class=\"note\">No Proxy.</p>".into();
    }
    let mut table = Table::new(
        "proxies",
        &[
            "Proxy",
            "Pool",
            "Provider",
            "Zone",
            "Phase",
            "Ready reason",
            "Lease",
            "Address",
            "Exit IP",
            "Age",
        ],
    );
    for p in &s.proxies {
        table.row([
            Cell::text(&format!("{}/{}", p.namespace, p.name)),
            Cell::text(&p.pool),
            Cell::text(&p.provider),
            Cell::text(&p.zone),
            Cell::badge(&p.phase),
            Cell::titled(&p.ready_reason, &p.ready_message),
            Cell::badge(&p.lease_state),
            Cell::text(&p.address),
            Cell::text(&p.exit_ip),
            Cell::text(&p.age),
        ]);
    }
    let mut html = table.finish();
    if s.proxies_hidden > 0 {
        let _ = write!(
            html,
            "<p class=\"note\">… and {} more (kubectl get proxies).</p>",
            s.proxies_hidden
        );
    }
    html
}

fn leases(s: &Snapshot) -> String {
    let Some(leases) = &s.leases else {
        return "<p class=\"note\" id=\"leases\">Leases are on the leader.</p>".into();
    };
    if leases.is_empty() {
        return "<p class=\"note\" id=\"leases\">No lease held.</p>".into();
    }
    let mut table = Table::new(
        "leases",
        &["Lease", "Proxy", "Pool", "Holder", "Session", "Expires in"],
    );
    for l in leases {
        table.row([
            Cell::text(&format!("{}…", l.id)),
            Cell::text(&l.proxy),
            Cell::text(&l.pool),
            Cell::text(&l.holder),
            Cell::text(if l.session { "yes" } else { "" }),
            Cell::text(&l.expires_in),
        ]);
    }
    let mut html = table.finish();
    if s.leases_hidden > 0 {
        let _ = write!(
            html,
            "<p class=\"note\">… and {} more.</p>",
            s.leases_hidden
        );
    }
    html
}

fn blocks(s: &Snapshot) -> String {
    if s.blocks.is_empty() {
        return "<p class=\"note\" id=\"blocks\">No block in the last hour.</p>".into();
    }
    let most = s.blocks.iter().map(|(_, n)| *n).max().unwrap_or(0);
    let mut table = Table::new("blocks", &["Target", "Blocks"]);
    for (target, n) in &s.blocks {
        table.row([Cell::text(target), Cell::bar(*n, most)]);
    }
    table.finish()
}

fn plugins(s: &Snapshot) -> String {
    if s.plugins.is_empty() {
        return "<p class=\"note\">No provider configured.</p>".into();
    }
    let mut table = Table::new(
        "plugins",
        &[
            "Provider",
            "Plugin",
            "Version",
            "WIT",
            "sha256",
            "Capabilities",
            "Description",
        ],
    );
    for p in &s.plugins {
        let description = match &p.not_loaded {
            Some(why) => Cell::titled("not loaded", why),
            None => Cell::short(&p.description, 60),
        };
        table.row([
            Cell::text(&p.provider),
            Cell::text(&p.plugin),
            Cell::text(&p.version),
            Cell::text(&p.wit_version),
            Cell::short(&p.sha256, 12),
            Cell::text(&p.capabilities.join(", ")),
            description,
        ]);
    }
    table.finish()
}

#[cfg(test)]
mod tests {
    use super::super::snapshot::{
        LeaseRow, PluginRow, PoolRow, ProviderRow, ProxyRow, TeamUsage, Usage,
    };
    use super::*;

    fn proxy(name: &str, phase: &str, reason: &str, lease: &str) -> ProxyRow {
        ProxyRow {
            namespace: "crawl".into(),
            name: name.into(),
            pool: "fleet".into(),
            provider: "gcp-eu".into(),
            zone: "europe-west1-b".into(),
            phase: phase.into(),
            ready_reason: reason.into(),
            ready_message: format!("{reason} because"),
            address: "203.0.113.7:3128".into(),
            exit_ip: "198.51.100.7".into(),
            lease_state: lease.into(),
            age: "5m".into(),
        }
    }

    fn sample() -> Snapshot {
        Snapshot {
            generated_at: "2026-12-06T10:00:00Z".into(),
            replica: Replica::Leader,
            pools: vec![PoolRow {
                namespace: "crawl".into(),
                name: "fleet".into(),
                desired: 3,
                ready: 2,
                leased: 1,
                cooling: Some(1),
                draining: 0,
            }],
            providers: vec![ProviderRow {
                name: "gcp-eu".into(),
                provider_type: "gcp".into(),
                ready: Some(true),
                reason: "Healthy".into(),
                message: "2 of 2 targets ok".into(),
                targets: "2/2".into(),
                last_check: "10s ago".into(),
            }],
            proxies: vec![
                proxy("a", "Ready", "Healthy", "leased"),
                proxy("b", "Ready", "Healthy", "coolingDown"),
                proxy("c", "Unhealthy", "ProbeFailed", "unhealthy"),
            ],
            phases: vec![("Ready".into(), 2), ("Unhealthy".into(), 1)],
            proxies_hidden: 0,
            leases: Some(vec![LeaseRow {
                id: "0f3a9c2e".into(),
                proxy: "crawl/a".into(),
                pool: "fleet".into(),
                holder: "system:serviceaccount:crawl:bot".into(),
                session: true,
                expires_in: "4m".into(),
            }]),
            leases_hidden: 0,
            blocks: vec![("shop.example".into(), 3), ("other".into(), 1)],
            plugins: vec![PluginRow {
                provider: "gcp-eu".into(),
                plugin: "gcp".into(),
                version: "0.3.0".into(),
                wit_version: "0.2.0".into(),
                sha256: "ab".repeat(32),
                capabilities: vec!["http".into(), "log".into()],
                description: "Compute Engine VMs".into(),
                not_loaded: None,
            }],
            usage: Usage {
                instance_seconds: vec![("gcp-eu".into(), "europe-west1-b".into(), 7200.0)],
                created_deleted: vec![("gcp-eu".into(), 4.0, 1.0)],
                leases_granted: vec![("crawl/fleet".into(), 12.0)],
                first_block: vec![("gcp-eu".into(), 1, 1500.0)],
                gateway_bytes: vec![("crawl/fleet".into(), 2048, 1_572_864)],
                by_namespace: [(
                    "crawl".to_string(),
                    TeamUsage {
                        instance_seconds: 7200.0,
                        leases_granted: 12.0,
                    },
                )]
                .into(),
            },
        }
    }

    #[test]
    fn the_page_shows_every_section_with_its_states_and_counts() {
        let html = page(&sample());
        // (what a reader looks for, the markup that shows it)
        let cases = [
            ("the role", "<b id=\"replica\">the leader</b>"),
            ("proxies in all", "<b id=\"proxies-total\">3</b>"),
            ("per phase", "<b data-phase=\"Unhealthy\">1</b>"),
            (
                "a pool's counts",
                "<td>crawl/fleet</td><td>3</td><td>2</td><td>1</td><td>1</td><td>0</td>",
            ),
            (
                "a provider's health",
                "<span class=\"badge good\">ok</span>",
            ),
            (
                "a failing proxy",
                "<span class=\"badge bad\">Unhealthy</span>",
            ),
            (
                "its reason",
                "<span title=\"ProbeFailed because\">ProbeFailed</span>",
            ),
            ("a leased proxy", "<span class=\"badge busy\">leased</span>"),
            (
                "a cooling proxy",
                "<span class=\"badge warn\">coolingDown</span>",
            ),
            ("an exit IP", "<td>198.51.100.7</td>"),
            (
                "a lease's holder",
                "<td>system:serviceaccount:crawl:bot</td>",
            ),
            ("a lease's id, shortened", "<td>0f3a9c2e…</td>"),
            (
                "blocks per target",
                "<td>shop.example</td><td><span class=\"bar\" style=\"width:100%\"></span>3</td>",
            ),
            (
                "instance-hours",
                "<td>gcp-eu</td><td>europe-west1-b</td><td>2.00</td><td>7200</td>",
            ),
            ("created and deleted", "<td>gcp-eu</td><td>4</td><td>1</td>"),
            (
                "a team's usage, its pools' gateway bytes included",
                "<td>crawl</td><td>2.00</td><td>12</td><td><span title=\"2048\">2.0 KiB</span></td>",
            ),
            ("leases per pool", "<td>crawl/fleet</td><td>12</td>"),
            ("first block", "<td>gcp-eu</td><td>1</td><td>25m</td>"),
            (
                "gateway bytes per pool",
                "<td>crawl/fleet</td><td><span title=\"2048\">2.0 KiB</span></td><td><span title=\"1572864\">1.5 MiB</span></td>",
            ),
            (
                "a plugin's digest",
                "<span title=\"abababababababababababababababababababababababababababababababab\">abababababab…</span>",
            ),
            ("its capabilities", "<td>http, log</td>"),
            ("the refresh", "setInterval(refresh,5*1000)"),
        ];
        for (what, markup) in cases {
            assert!(html.contains(markup), "{what}: {markup} not in\n{html}");
        }
        // The fragment is the page's <main> content.
        assert!(html.contains(&format!(
            "<main id=\"status\" data-refreshes=\"0\">{}</main>",
            fragment(&sample())
        )));
    }

    #[test]
    fn a_standby_and_an_empty_fleet_say_so() {
        let snapshot = Snapshot {
            replica: Replica::Standby {
                leader: Some("operator-7d9f-abc".into()),
            },
            ..Snapshot::default()
        };
        let html = fragment(&snapshot);
        for words in [
            "a standby (the leader is operator-7d9f-abc)",
            "Leases are on the leader.",
            "No ProxyPool.",
            "No Proxy.",
            "<p class=\"note\" id=\"blocks\">Counted by the leader",
            "<p class=\"note\" id=\"usage\">Counted by the leader",
        ] {
            assert!(html.contains(words), "{words} not in\n{html}");
        }
        let empty = fragment(&Snapshot {
            replica: Replica::Leader,
            ..Snapshot::default()
        });
        for words in ["No block in the last hour.", "No instance counted yet."] {
            assert!(empty.contains(words), "{words} not in\n{empty}");
        }
        let mut pools = sample();
        pools.pools[0].cooling = None;
        assert!(fragment(&pools).contains("<td>on the leader</td>"));
    }

    #[test]
    fn no_text_from_the_cluster_a_plugin_or_a_crawler_becomes_markup() {
        // Markup, and the control sequences of docs/security.md ("What a reader is shown"):
        // OSC 52 (the clipboard), CSI (clear the screen) in its C1 form, a bidi override.
        let evil = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>&\x1b]52;c;ZXZpbA==\x07\u{9b}2J\u{202e}\r";
        let mut s = sample();
        s.generated_at = evil.into();
        s.replica = Replica::Standby {
            leader: Some(evil.into()),
        };
        s.phases = vec![(evil.into(), 1)];
        let p = &mut s.pools[0];
        (p.namespace, p.name) = (evil.into(), evil.into());
        let p = &mut s.providers[0];
        (p.name, p.provider_type, p.reason, p.message) =
            (evil.into(), evil.into(), evil.into(), evil.into());
        (p.targets, p.last_check) = (evil.into(), evil.into());
        for p in &mut s.proxies {
            let ev = || evil.to_string();
            (p.namespace, p.name, p.pool, p.provider, p.zone) = (ev(), ev(), ev(), ev(), ev());
            (p.phase, p.ready_reason, p.ready_message) = (ev(), ev(), ev());
            (p.address, p.exit_ip, p.lease_state, p.age) = (ev(), ev(), ev(), ev());
        }
        let l = &mut s.leases.as_mut().unwrap()[0];
        (l.id, l.proxy, l.pool, l.holder, l.expires_in) = (
            evil.into(),
            evil.into(),
            evil.into(),
            evil.into(),
            evil.into(),
        );
        s.blocks = vec![(evil.into(), 2)];
        let p = &mut s.plugins[0];
        (p.provider, p.plugin, p.version, p.wit_version, p.sha256) = (
            evil.into(),
            evil.into(),
            evil.into(),
            evil.into(),
            evil.into(),
        );
        (p.capabilities, p.description) = (vec![evil.into()], evil.into());
        let mut not_loaded = p.clone();
        not_loaded.not_loaded = Some(evil.into());
        s.plugins.push(not_loaded);
        let u = &mut s.usage;
        u.instance_seconds[0].0 = evil.into();
        u.instance_seconds[0].1 = evil.into();
        u.created_deleted[0].0 = evil.into();
        u.leases_granted[0].0 = evil.into();
        u.first_block[0].0 = evil.into();
        u.gateway_bytes[0].0 = evil.into();
        u.by_namespace.insert(evil.into(), TeamUsage::default());
        let html = page(&s);
        for raw in ["<script>alert", "<img", "onerror=alert(2)>", "\"'>"] {
            assert!(!html.contains(raw), "{raw} in\n{html}");
        }
        for c in ['\x1b', '\x07', '\u{9b}', '\u{202e}', '\r'] {
            assert!(!html.contains(c), "{c:?} in the page");
        }
        assert!(!html.contains("52;c;"), "the OSC 52 payload in the page");
        // The page's own markup only: one script, its own.
        assert_eq!(html.matches("<script").count(), 1);
        assert!(
            html.matches("&lt;script&gt;alert(1)&lt;/script&gt;")
                .count()
                >= 30
        );
    }

    #[test]
    fn the_page_loads_nothing_from_anywhere() {
        let html = page(&sample());
        for external in [
            "http://", "https://", "//", "@import", "url(", "src=", "href=",
        ] {
            assert!(!html.contains(external), "{external} in the page");
        }
    }
}
