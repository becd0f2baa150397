//! `kubectl px status`: the fleet as rows (pools, providers, proxies, blocks) from the objects
//! fetched and the lease table's facts, and those rows as tables. Pure.

use kube::ResourceExt;
use serde::Serialize;

use super::lease_table::{LeaseFacts, LeaseView};
use super::table::{Cell, Table, Tone, age, millis, relative, rfc3339};
use crate::api::labels::{DRAINING_ANNOTATION, POOL_LABEL};
use crate::api::{Phase, ProviderHealth, Proxy, ProxyPool};
use crate::faces::status_page::blocks_json::TargetBlocks;

/// What `status` looks at.
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    pub pools: Vec<ProxyPool>,
    pub proxies: Vec<Proxy>,
    pub providers: Vec<ProviderHealth>,
    pub leases: LeaseFacts,
    pub now_ms: u64,
    /// A host asked about with `--target`, and its digest as the table keeps it.
    pub target: Option<(String, String)>,
    /// The leader's blocks per target host over the last hour, or why they were not read
    /// (`None`: not asked for).
    pub recent_blocks: Option<Result<Vec<TargetBlocks>, String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRow {
    pub namespace: String,
    pub name: String,
    pub desired: i32,
    pub ready: i32,
    pub leased: i32,
    /// Members cooling down for every target (from the lease table).
    pub cooling: usize,
    pub draining: i32,
    pub up_to_date: i32,
    pub provider: String,
    pub created: Option<String>,
    #[serde(skip)]
    pub created_ms: Option<u64>,
    /// The `Ready` condition.
    pub ready_condition: Option<Brief>,
    /// While a provider instance's cap holds the pool below its replicas: the `CapReached`
    /// condition's message (the instance and the figure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cap_reached: Option<String>,
}

/// A condition's status and reason.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Brief {
    pub status: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderRow {
    pub name: String,
    pub provider_type: String,
    pub ready: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub targets: Option<String>,
    /// The `PluginLoaded` condition's message: the plugin serving it, version and digest.
    pub plugin: Option<String>,
    pub plugin_loaded: Option<String>,
    pub last_check: Option<String>,
    #[serde(skip)]
    pub last_check_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyRow {
    pub namespace: String,
    pub name: String,
    pub phase: Option<Phase>,
    /// The `Ready` condition's reason.
    pub reason: Option<String>,
    pub provider: String,
    pub pool: Option<String>,
    pub created: Option<String>,
    #[serde(skip)]
    pub created_ms: Option<u64>,
    pub address: Option<String>,
    #[serde(rename = "exitIP")]
    pub exit_ip: Option<String>,
    pub lease: Option<LeaseView>,
    pub draining: bool,
    pub cooling_down_until: Option<String>,
    #[serde(skip)]
    pub cooling_down_until_ms: Option<u64>,
    pub blocked_reports: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockRow {
    pub namespace: String,
    pub name: String,
    pub blocked_reports: u32,
    /// Cooling down for every target until then.
    pub cooling_down_until: Option<String>,
    #[serde(skip)]
    pub cooling_down_until_ms: Option<u64>,
    /// Targets it cools down for, and the latest end.
    pub targets_cooling_down: usize,
    pub latest_target_cooldown_until: Option<String>,
    #[serde(skip)]
    pub latest_target_cooldown_ms: Option<u64>,
    /// With `--target HOST`: until when it cools down for that host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_cooldown_until: Option<String>,
    #[serde(skip)]
    pub target_cooldown_ms: Option<u64>,
}

/// The whole screen, as `-o json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetView {
    pub pools: Vec<PoolRow>,
    pub providers: Vec<ProviderRow>,
    pub proxies: Vec<ProxyRow>,
    pub blocks: Vec<BlockRow>,
    /// The leader's blocks per target host over the last hour, when it could be asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recent_blocks: Option<Vec<TargetBlocks>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    pub notes: Vec<String>,
}

/// `namespace/name`, as the kubectl plugin prints a Proxy or a pool (and keys its maps).
pub fn qualified_name(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

fn condition(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<(String, String, String)> {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

pub fn pool_row(pool: &ProxyPool, fleet: &Fleet) -> PoolRow {
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let cooling = fleet
        .proxies
        .iter()
        .filter(|p| {
            p.namespace().as_deref() == Some(namespace.as_str())
                && p.labels().get(POOL_LABEL) == Some(&name)
        })
        .filter(|p| {
            fleet
                .leases
                .cooling_until(&qualified_name(&namespace, &p.name_any()))
                .is_some()
        })
        .count();
    let status = pool.status.clone().unwrap_or_default();
    let created_ms = pool.metadata.creation_timestamp.as_ref().map(millis);
    PoolRow {
        desired: pool.spec.replicas,
        ready: status.ready_replicas,
        leased: status.leased_replicas,
        cooling,
        draining: status.draining_replicas,
        up_to_date: status.updated_replicas,
        provider: pool.spec.template.spec.provider.clone(),
        created: created_ms.map(rfc3339),
        created_ms,
        ready_condition: condition(&status.conditions, "Ready")
            .map(|(status, reason, _)| Brief { status, reason }),
        cap_reached: condition(&status.conditions, crate::api::conditions::CAP_REACHED)
            .filter(|(status, _, _)| status == "True")
            .map(|(_, _, message)| message),
        namespace,
        name,
    }
}

pub fn provider_row(health: &ProviderHealth) -> ProviderRow {
    let status = health.status.clone().unwrap_or_default();
    let ready = condition(&status.conditions, "Ready");
    let plugin = condition(&status.conditions, "PluginLoaded");
    let last_check_ms = status.last_check_time.as_ref().map(millis);
    ProviderRow {
        name: health.name_any(),
        provider_type: health.spec.provider_type.clone(),
        ready: ready.as_ref().map(|c| c.0.clone()),
        reason: ready.as_ref().map(|c| c.1.clone()),
        message: ready.map(|c| c.2),
        targets: status.targets_summary.clone(),
        plugin_loaded: plugin.as_ref().map(|c| c.0.clone()),
        plugin: plugin.map(|c| c.2),
        last_check: last_check_ms.map(rfc3339),
        last_check_ms,
    }
}

pub fn proxy_row(proxy: &Proxy, leases: &LeaseFacts) -> ProxyRow {
    let namespace = proxy.namespace().unwrap_or_default();
    let name = proxy.name_any();
    let key = qualified_name(&namespace, &name);
    let status = proxy.status.clone().unwrap_or_default();
    let created_ms = proxy.metadata.creation_timestamp.as_ref().map(millis);
    let cooling = leases.cooling_until(&key);
    ProxyRow {
        phase: if proxy.metadata.deletion_timestamp.is_some() {
            Some(Phase::Deleting)
        } else {
            status.phase
        },
        reason: condition(&status.conditions, "Ready").map(|c| c.1),
        provider: proxy.spec.provider.clone(),
        pool: proxy.labels().get(POOL_LABEL).cloned(),
        created: created_ms.map(rfc3339),
        created_ms,
        address: status
            .address
            .as_ref()
            .map(|a| format!("{a}:{}", status.port.unwrap_or(proxy.spec.port))),
        exit_ip: status.exit_ip.clone(),
        lease: leases.lease(&key).cloned(),
        draining: proxy
            .annotations()
            .get(DRAINING_ANNOTATION)
            .is_some_and(|v| v == "true"),
        cooling_down_until: cooling.map(rfc3339),
        cooling_down_until_ms: cooling,
        blocked_reports: leases.blocked(&key),
        namespace,
        name,
    }
}

/// The proxies with anything to show about blocks: a report, a cooldown (for all or some
/// targets).
pub fn block_rows(fleet: &Fleet) -> Vec<BlockRow> {
    fleet
        .proxies
        .iter()
        .filter_map(|proxy| {
            let namespace = proxy.namespace().unwrap_or_default();
            let name = proxy.name_any();
            let key = qualified_name(&namespace, &name);
            let blocked = fleet.leases.blocked(&key);
            let cooling = fleet.leases.cooling_until(&key);
            let (targets, latest) = fleet.leases.targets_cooling(&key);
            let for_target = fleet
                .target
                .as_ref()
                .and_then(|(_, digest)| fleet.leases.cooling_for(&key, digest));
            (blocked > 0 || cooling.is_some() || targets > 0).then(|| BlockRow {
                namespace,
                name,
                blocked_reports: blocked,
                cooling_down_until: cooling.map(rfc3339),
                cooling_down_until_ms: cooling,
                targets_cooling_down: targets,
                latest_target_cooldown_until: latest.map(rfc3339),
                latest_target_cooldown_ms: latest,
                target_cooldown_until: for_target.map(rfc3339),
                target_cooldown_ms: for_target,
            })
        })
        .collect()
}

/// Every row of the screen, sorted by namespace and name.
pub fn view(fleet: &Fleet) -> FleetView {
    let mut pools: Vec<PoolRow> = fleet.pools.iter().map(|p| pool_row(p, fleet)).collect();
    pools.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut providers: Vec<ProviderRow> = fleet.providers.iter().map(provider_row).collect();
    providers.sort_by(|a, b| a.name.cmp(&b.name));
    let mut proxies: Vec<ProxyRow> = fleet
        .proxies
        .iter()
        .map(|p| proxy_row(p, &fleet.leases))
        .collect();
    proxies.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut blocks = block_rows(fleet);
    blocks.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut notes: Vec<String> = pools
        .iter()
        .filter_map(|row| {
            let message = row.cap_reached.as_ref()?;
            let pool = qualified_name(&row.namespace, &row.name);
            Some(format!("pool {pool} is capped (CapReached): {message}"))
        })
        .collect();
    if let Some(why) = &fleet.leases.unreadable {
        notes.push(format!(
            "the lease table could not be read ({why}): lease holders, cooldowns and blocks are not shown"
        ));
    }
    let recent_blocks = match &fleet.recent_blocks {
        Some(Ok(rows)) => Some(rows.clone()),
        Some(Err(why)) => {
            notes.push(format!("recent blocks by target are not shown: {why}"));
            None
        }
        None => None,
    };
    FleetView {
        pools,
        providers,
        proxies,
        blocks,
        recent_blocks,
        target: fleet.target.as_ref().map(|(host, _)| host.clone()),
        notes,
    }
}

pub fn phase_tone(phase: Option<Phase>) -> Tone {
    match phase {
        Some(Phase::Ready) => Tone::Good,
        Some(Phase::Unhealthy) | Some(Phase::Failed) => Tone::Bad,
        Some(Phase::Deleting) => Tone::Dim,
        _ => Tone::Warn,
    }
}

pub fn phase_text(phase: Option<Phase>) -> String {
    phase.map_or("-".into(), |p| format!("{p:?}"))
}

fn or_dash(text: Option<&str>) -> String {
    text.filter(|t| !t.is_empty()).unwrap_or("-").to_string()
}

pub fn pools_table(rows: &[PoolRow], now_ms: u64) -> Table {
    let mut table = Table::new(&[
        "NAMESPACE",
        "POOL",
        "DESIRED",
        "READY",
        "LEASED",
        "COOLING",
        "DRAINING",
        "UP-TO-DATE",
        "PROVIDER",
        "AGE",
    ]);
    for row in rows {
        let ready_tone = if row.ready >= row.desired {
            Tone::Good
        } else {
            Tone::Warn
        };
        table.push(vec![
            row.namespace.as_str().into(),
            row.name.as_str().into(),
            row.desired.to_string().into(),
            Cell::new(row.ready.to_string(), ready_tone),
            row.leased.to_string().into(),
            row.cooling.to_string().into(),
            row.draining.to_string().into(),
            row.up_to_date.to_string().into(),
            row.provider.as_str().into(),
            row.created_ms.map_or("-".into(), |c| age(c, now_ms)).into(),
        ]);
    }
    table
}

pub fn providers_table(rows: &[ProviderRow], now_ms: u64) -> Table {
    let mut table = Table::new(&[
        "PROVIDER", "TYPE", "READY", "REASON", "TARGETS", "PLUGIN", "CHECKED",
    ]);
    for row in rows {
        let tone = match row.ready.as_deref() {
            Some("True") => Tone::Good,
            Some("False") => Tone::Bad,
            _ => Tone::Warn,
        };
        table.push(vec![
            row.name.as_str().into(),
            row.provider_type.as_str().into(),
            Cell::new(or_dash(row.ready.as_deref()), tone),
            or_dash(row.reason.as_deref()).into(),
            or_dash(row.targets.as_deref()).into(),
            // A plugin that is not loaded says why at length: `why`, `-o json` and the
            // ProviderHealth have it; the table stays one screen wide.
            if row.plugin_loaded.as_deref() == Some("True") {
                Cell::new(or_dash(row.plugin.as_deref()), Tone::Plain)
            } else {
                Cell::new("not loaded", Tone::Bad)
            },
            row.last_check_ms
                .map_or("-".into(), |c| relative(c, now_ms))
                .into(),
        ]);
    }
    table
}

/// What the lease table says of a proxy, in a few words.
pub fn lease_state(row: &ProxyRow, now_ms: u64) -> Cell {
    if row.draining {
        return Cell::new("draining", Tone::Warn);
    }
    if let Some(until) = row.cooling_down_until_ms {
        return Cell::new(
            format!("cooling down {}", relative(until, now_ms)),
            Tone::Warn,
        );
    }
    match &row.lease {
        Some(_) => Cell::new("leased", Tone::Plain),
        None if row.phase == Some(Phase::Ready) => Cell::new("free", Tone::Good),
        None => Cell::new("-", Tone::Dim),
    }
}

pub fn proxies_table(rows: &[ProxyRow], now_ms: u64) -> Table {
    let mut table = Table::new(&[
        "NAMESPACE",
        "PROXY",
        "PHASE",
        "REASON",
        "POOL",
        "AGE",
        "EXIT-IP",
        "LEASE",
        "HOLDER",
        "EXPIRES",
    ]);
    for row in rows {
        table.push(vec![
            row.namespace.as_str().into(),
            row.name.as_str().into(),
            Cell::new(phase_text(row.phase), phase_tone(row.phase)),
            or_dash(row.reason.as_deref()).into(),
            or_dash(row.pool.as_deref()).into(),
            row.created_ms.map_or("-".into(), |c| age(c, now_ms)).into(),
            or_dash(row.exit_ip.as_deref()).into(),
            lease_state(row, now_ms),
            row.lease
                .as_ref()
                .map_or("-".into(), |l| match &l.session {
                    Some(session) => format!("{} (session {session})", l.holder),
                    None => l.holder.clone(),
                })
                .into(),
            row.lease
                .as_ref()
                .map_or("-".into(), |l| relative(l.expires_at_ms, now_ms))
                .into(),
        ]);
    }
    table
}

pub fn blocks_table(rows: &[BlockRow], target: Option<&str>, now_ms: u64) -> Table {
    let target_header = target.map(|host| format!("FOR {host}"));
    let mut headers = vec![
        "NAMESPACE",
        "PROXY",
        "BLOCKED",
        "COOLING DOWN (ALL)",
        "TARGETS COOLING",
    ];
    if let Some(header) = &target_header {
        headers.push(header);
    }
    let mut table = Table::new(&headers);
    let when = |ms: Option<u64>| ms.map_or("-".to_string(), |m| relative(m, now_ms));
    for row in rows {
        let mut cells: Vec<Cell> = vec![
            row.namespace.as_str().into(),
            row.name.as_str().into(),
            row.blocked_reports.to_string().into(),
            when(row.cooling_down_until_ms).into(),
            match row.targets_cooling_down {
                0 => "-".to_string(),
                n => format!("{n} (last ends {})", when(row.latest_target_cooldown_ms)),
            }
            .into(),
        ];
        if target.is_some() {
            cells.push(Cell::new(
                when(row.target_cooldown_ms),
                if row.target_cooldown_ms.is_some() {
                    Tone::Warn
                } else {
                    Tone::Plain
                },
            ));
        }
        table.push(cells);
    }
    table
}

/// The screen: each section that has rows, under its title, and the notes.
pub fn render(view: &FleetView, all_namespaces: bool, now_ms: u64, colour: bool) -> String {
    let scoped = |table: Table| {
        if all_namespaces {
            table
        } else {
            table.without_first_column()
        }
    };
    let mut sections = Vec::new();
    if !view.pools.is_empty() {
        sections.push(scoped(pools_table(&view.pools, now_ms)).render(colour));
    }
    if !view.providers.is_empty() {
        sections.push(providers_table(&view.providers, now_ms).render(colour));
    }
    sections.push(if view.proxies.is_empty() {
        "No Proxies.\n".to_string()
    } else {
        scoped(proxies_table(&view.proxies, now_ms)).render(colour)
    });
    if !view.blocks.is_empty() {
        sections.push(
            scoped(blocks_table(&view.blocks, view.target.as_deref(), now_ms)).render(colour),
        );
    } else if let Some(host) = &view.target {
        sections.push(format!("No proxy cools down for {host}.\n"));
    }
    if let Some(rows) = &view.recent_blocks {
        sections.push(super::recent_blocks::render(rows, colour));
    }
    let mut out = sections.join("\n");
    for note in &view.notes {
        out.push_str(&format!("\nNote: {note}\n"));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
