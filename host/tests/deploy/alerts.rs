//! The alerts checked by Prometheus's own tool: `promtool check rules` on the PrometheusRule's
//! groups as `kubectl kustomize` renders the monitoring component (the Helm chart renders the
//! same file), then `promtool test rules` on deploy/monitoring/tests/alerts.test.yaml, where
//! the capacity alerts have cases that fire and cases that stay silent. promtool is Debian's
//! `prometheus` package (.ci/install-fixtures.sh); without it the test fails, never skips.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use super::{repo, with_component};

/// Alerts whose promtool cases must both fire and stay silent.
const TESTED_ALERTS: [&str; 2] = [
    "ProxyOperatorNoLeasableCapacity",
    "ProxyOperatorPoolExhausted",
];

fn promtool() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("promtool"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "promtool is not on PATH: install Debian's prometheus package (.ci/install-fixtures.sh)"
            )
        })
}

/// Runs promtool with `args` in `dir`; its output, or a failure that shows it.
fn run_promtool(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// The PrometheusRule's groups as a Prometheus rule file (JSON is YAML).
fn rule_file() -> Value {
    let objects = with_component("deploy/monitoring");
    let rule = objects
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("a PrometheusRule in deploy/monitoring");
    json!({"groups": rule["spec"]["groups"]})
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let rules = rule_file();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), rules.to_string()).unwrap();
    let checked = run_promtool(dir.path(), &["check", "rules", "rules.yaml"]);
    let count = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["rules"].as_array().unwrap().len())
        .sum::<usize>();
    assert!(
        checked.contains(&format!("SUCCESS: {count} rules found")),
        "{checked}"
    );

    let cases_path = repo().join("deploy/monitoring/tests/alerts.test.yaml");
    let cases_text = std::fs::read_to_string(&cases_path).unwrap();
    std::fs::write(dir.path().join("alerts.test.yaml"), &cases_text).unwrap();
    run_promtool(dir.path(), &["test", "rules", "alerts.test.yaml"]);

    // Each alert named here has a case where it fires and one where it stays silent, at a time
    // past its `for`.
    let cases: Value = proxy_operator::support::yaml::from_str(&cases_text).unwrap();
    let alerts: Vec<&str> = rules["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["alert"].as_str())
        .collect();
    for alert in TESTED_ALERTS {
        assert!(alerts.contains(&alert), "{alert} in {alerts:?}");
        let checks: Vec<&Value> = cases["tests"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
            .filter(|c| c["alertname"] == alert)
            .collect();
        let past_for = |c: &&&Value| c["eval_time"].as_str().is_some_and(|t| t != "5m");
        assert!(
            checks
                .iter()
                .filter(past_for)
                .any(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty())),
            "{alert}: no case where it fires"
        );
        assert!(
            checks
                .iter()
                .filter(past_for)
                .any(|c| c["exp_alerts"].as_array().is_some_and(|a| a.is_empty())),
            "{alert}: no case past its `for` where it stays silent"
        );
    }
}

#[test]
fn promtool_fails_a_case_the_rules_do_not_meet() {
    // The harness above would pass a promtool that accepts anything: a wrong expectation fails.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), rule_file().to_string()).unwrap();
    let cases = std::fs::read_to_string(repo().join("deploy/monitoring/tests/alerts.test.yaml"))
        .unwrap()
        .replace("summary: Pool team-b/crawl", "summary: Pool team-z/crawl");
    std::fs::write(dir.path().join("alerts.test.yaml"), cases).unwrap();
    let out = Command::new(promtool())
        .args(["test", "rules", "alerts.test.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("FAILED") && text.contains("team-z/crawl"),
        "{text}"
    );
}
