//! `kubectl px usage`: what a team used and spent, from the leader's usage book
//! (`/status/usage.json`): per namespace, or per pool or provider instance within the
//! namespaces asked for, over the last hour, the last day and since the book began. Pure:
//! the report in, the view and its table out.

use std::collections::BTreeMap;

use serde::Serialize;

use super::table::{Table, bold, rfc3339};
use crate::faces::status_page::usage_json::UsageReport;
use crate::faces::usage::book::{Figures, UsageRow};

/// How rows are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    Namespace,
    Pool,
    Provider,
}

/// One group's figures over the three windows.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageLine {
    pub namespace: String,
    /// The pool or provider instance (`--by pool|provider`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub last_hour: Figures,
    pub last_day: Figures,
    pub total: Figures,
}

/// What `usage` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageView {
    /// When the book began (RFC 3339): `total` is since then.
    pub since: String,
    pub lines: Vec<UsageLine>,
}

/// The report's rows of `namespaces` (`None`: every one), grouped `by`.
pub fn view(report: &UsageReport, namespaces: Option<&[String]>, by: By) -> UsageView {
    let mut groups: BTreeMap<(String, Option<String>), UsageLine> = BTreeMap::new();
    let wanted = |row: &UsageRow| namespaces.is_none_or(|n| n.contains(&row.key.namespace));
    for row in report.rows.iter().filter(|r| wanted(r)) {
        let group = match by {
            By::Namespace => None,
            By::Pool => Some(row.key.pool.clone()),
            By::Provider => Some(row.key.provider.clone()),
        };
        let line = groups
            .entry((row.key.namespace.clone(), group.clone()))
            .or_insert_with(|| UsageLine {
                namespace: row.key.namespace.clone(),
                group,
                last_hour: Figures::default(),
                last_day: Figures::default(),
                total: Figures::default(),
            });
        line.last_hour += row.last_hour;
        line.last_day += row.last_day;
        line.total += row.total;
    }
    UsageView {
        since: rfc3339(report.since_ms),
        lines: groups.into_values().collect(),
    }
}

/// Which of a line's windows a table shows.
type FiguresOf = fn(&UsageLine) -> &Figures;

/// One table per window, the same rows in each.
pub fn render(view: &UsageView, by: By, colour: bool) -> String {
    if view.lines.is_empty() {
        return "No usage recorded for these namespaces yet.\n".into();
    }
    let group_header = match by {
        By::Namespace => None,
        By::Pool => Some("POOL"),
        By::Provider => Some("PROVIDER"),
    };
    let windows: [(String, FiguresOf); 3] = [
        ("Last hour".into(), |l| &l.last_hour),
        ("Last day".into(), |l| &l.last_day),
        (format!("Since {}", view.since), |l| &l.total),
    ];
    let mut text = String::new();
    for (title, figures_of) in windows {
        text.push_str(&bold(&title, colour));
        text.push('\n');
        let mut headers = vec!["NAMESPACE"];
        headers.extend(group_header);
        headers.extend([
            "INSTANCE-HOURS",
            "SPEND",
            "LEASES",
            "GATEWAY-SENT",
            "GATEWAY-RECEIVED",
        ]);
        let mut table = Table::new(&headers);
        for line in &view.lines {
            let f = figures_of(line);
            let mut row = vec![line.namespace.clone().into()];
            row.extend(line.group.clone().map(Into::into));
            row.extend([
                format!("{:.2}", f.instance_seconds / 3600.0).into(),
                format!("{:.2}", f.spend).into(),
                format!("{}", f.leases_granted).into(),
                human(f.gateway_bytes_sent).into(),
                human(f.gateway_bytes_received).into(),
            ]);
            table.push(row);
        }
        text.push_str(&table.render(colour));
        text.push('\n');
    }
    text.push_str("Spend is instance-hours at the providers config's limits.pricePerHour (0 where none is stated); gateway bytes are per pool (PROVIDER -).\n");
    text
}

fn human(bytes: f64) -> String {
    crate::faces::status_page::human_bytes(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faces::usage::book::RowKey;

    fn row(namespace: &str, pool: &str, provider: &str, seconds: f64, leases: f64) -> UsageRow {
        let f = Figures {
            instance_seconds: seconds,
            leases_granted: leases,
            ..Default::default()
        };
        UsageRow {
            key: RowKey::new(namespace, pool, provider),
            total: f,
            last_hour: f,
            last_day: f,
        }
    }

    fn report() -> UsageReport {
        UsageReport {
            replica: "leader".into(),
            since_ms: 1_765_000_000_000,
            rows: vec![
                row("team-a", "crawl", "gcp", 3600.0, 4.0),
                row("team-a", "crawl", "kvm", 7200.0, 1.0),
                row("team-a", "bulk", "gcp", 1800.0, 0.0),
                row("team-b", "crawl", "gcp", 36.0, 9.0),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn a_team_sees_its_namespaces_only_grouped_as_asked() {
        let team_a = ["team-a".to_string()];
        // (namespaces, by, lines as (namespace, group, instance-seconds, leases))
        // (namespace, group, instance-seconds, leases)
        type Line<'a> = (&'a str, Option<&'a str>, f64, f64);
        type Case<'a> = (Option<&'a [String]>, By, Vec<Line<'a>>);
        let cases: Vec<Case> = vec![
            (
                Some(&team_a),
                By::Namespace,
                vec![("team-a", None, 12600.0, 5.0)],
            ),
            (
                Some(&team_a),
                By::Pool,
                vec![
                    ("team-a", Some("bulk"), 1800.0, 0.0),
                    ("team-a", Some("crawl"), 10800.0, 5.0),
                ],
            ),
            (
                Some(&team_a),
                By::Provider,
                vec![
                    ("team-a", Some("gcp"), 5400.0, 4.0),
                    ("team-a", Some("kvm"), 7200.0, 1.0),
                ],
            ),
            (
                None,
                By::Namespace,
                vec![("team-a", None, 12600.0, 5.0), ("team-b", None, 36.0, 9.0)],
            ),
        ];
        for (namespaces, by, want) in cases {
            let got: Vec<_> = view(&report(), namespaces, by)
                .lines
                .iter()
                .map(|l| {
                    (
                        l.namespace.clone(),
                        l.group.clone(),
                        l.total.instance_seconds,
                        l.total.leases_granted,
                    )
                })
                .collect();
            let want: Vec<_> = want
                .into_iter()
                .map(|(n, g, s, l)| (n.to_string(), g.map(str::to_string), s, l))
                .collect();
            assert_eq!(got, want, "{namespaces:?} by {by:?}");
        }
    }

    #[test]
    fn the_table_has_a_section_per_window_with_hours_and_leases() {
        let team_a = ["team-a".to_string()];
        let text = render(&view(&report(), Some(&team_a), By::Pool), By::Pool, false);
        assert!(text.starts_with("Last hour\nNAMESPACE"), "{text}");
        assert_eq!(text.matches("team-a").count(), 6, "{text}");
        assert!(text.contains("Since 2025-12-06T05:46:40Z"), "{text}");
        let crawl = text.lines().find(|l| l.contains("crawl")).unwrap();
        assert_eq!(
            crawl.split_whitespace().collect::<Vec<_>>(),
            ["team-a", "crawl", "3.00", "0.00", "5", "0", "B", "0", "B"]
        );
        assert!(!text.contains("team-b"));
        let none = render(
            &view(&report(), Some(&["x".into()]), By::Namespace),
            By::Namespace,
            false,
        );
        assert_eq!(none, "No usage recorded for these namespaces yet.\n");
    }
}
