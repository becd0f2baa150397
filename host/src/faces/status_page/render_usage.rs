//! The usage section of the page: the billing figures, as the metrics count them.

use super::html::{Cell, Table};
use super::snapshot::{Usage, human_bytes, human_duration};

/// Instance-hours, proxies created and deleted, leases granted, how long proxies last before
/// their first block, and the bytes through the gateway per pool.
pub fn usage(u: &Usage) -> String {
    let mut html = String::new();
    if u.instance_seconds.is_empty() && u.created_deleted.is_empty() {
        html.push_str("<p class=\"note\" id=\"usage\">No instance counted yet.</p>");
    } else {
        let mut table = Table::new(
            "instance-hours",
            &["Provider", "Zone", "Instance-hours", "Instance-seconds"],
        );
        for (provider, zone, seconds) in &u.instance_seconds {
            table.row([
                Cell::text(provider),
                Cell::text(zone),
                Cell::number(format!("{:.2}", seconds / 3600.0)),
                Cell::number(format!("{seconds:.0}")),
            ]);
        }
        html.push_str(&table.finish());
        let mut table = Table::new("created-deleted", &["Provider", "Created", "Deleted"]);
        for (provider, created, deleted) in &u.created_deleted {
            table.row([
                Cell::text(provider),
                Cell::number(created),
                Cell::number(deleted),
            ]);
        }
        html.push_str(&table.finish());
    }
    html.push_str(&teams(u));
    if !u.leases_granted.is_empty() {
        let mut table = Table::new("leases-granted", &["Pool", "Leases granted"]);
        for (pool, n) in &u.leases_granted {
            table.row([Cell::text(pool), Cell::number(n)]);
        }
        html.push_str(&table.finish());
    }
    if !u.first_block.is_empty() {
        let mut table = Table::new(
            "first-block",
            &["Provider", "Proxies blocked", "Mean age at first block"],
        );
        for (provider, count, mean) in &u.first_block {
            table.row([
                Cell::text(provider),
                Cell::number(count),
                Cell::text(&human_duration(*mean as u64)),
            ]);
        }
        html.push_str(&table.finish());
    }
    if !u.gateway_bytes.is_empty() {
        let mut table = Table::new(
            "gateway-bytes",
            &["Pool", "Gateway bytes sent", "Gateway bytes received"],
        );
        for (pool, sent, received) in &u.gateway_bytes {
            table.row([
                Cell::text(pool),
                Cell::titled(&human_bytes(*sent), &sent.to_string()),
                Cell::titled(&human_bytes(*received), &received.to_string()),
            ]);
        }
        html.push_str(&table.finish());
        html.push_str(
            "<p class=\"note\">Gateway bytes: sent and received by its clients, since this leader started, as the gateway replicas report them every 5 s. Each replica counts its own on its /metrics (<code>proxy_operator_gateway_bytes_total</code>).</p>",
        );
    }
    html
}

/// One row per team (namespace): what a platform team bills each crawler team from.
fn teams(u: &Usage) -> String {
    let teams = u.teams();
    if teams.is_empty() {
        return String::new();
    }
    let mut table = Table::new(
        "teams",
        &[
            "Namespace",
            "Instance-hours",
            "Leases granted",
            "Gateway bytes sent",
            "Gateway bytes received",
        ],
    );
    for (namespace, (usage, sent, received)) in &teams {
        table.row([
            Cell::text(namespace),
            Cell::number(format!("{:.2}", usage.instance_seconds / 3600.0)),
            Cell::number(usage.leases_granted),
            Cell::titled(&human_bytes(*sent), &sent.to_string()),
            Cell::titled(&human_bytes(*received), &received.to_string()),
        ]);
    }
    table.finish()
}
