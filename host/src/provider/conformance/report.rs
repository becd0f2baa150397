//! The suite's result: one line per check for people, one JSON document for CI.

use serde::Serialize;

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Pass,
    Fail,
    /// Not run: an earlier check it depends on failed.
    Skip,
}

/// One check: a stable name (`create-idempotent`), how it ended and what was seen.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    pub name: String,
    pub outcome: Outcome,
    pub detail: String,
}

/// Every check of one run, in the order they ran.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub plugin: String,
    pub version: String,
    pub passed: bool,
    pub checks: Vec<CheckResult>,
}

impl Report {
    pub(super) fn new(plugin: &str, version: &str) -> Report {
        Report {
            plugin: plugin.to_string(),
            version: version.to_string(),
            passed: true,
            checks: Vec::new(),
        }
    }

    /// Records a check from its verdict; returns whether it passed, so later checks can depend on it.
    pub(super) fn record(
        &mut self,
        name: impl Into<String>,
        verdict: Result<String, String>,
    ) -> bool {
        let (outcome, detail) = match verdict {
            Ok(detail) => (Outcome::Pass, detail),
            Err(detail) => (Outcome::Fail, detail),
        };
        self.passed &= outcome != Outcome::Fail;
        self.checks.push(CheckResult {
            name: name.into(),
            outcome,
            detail,
        });
        outcome == Outcome::Pass
    }

    pub(super) fn skip(&mut self, names: &[&str], because: &str) {
        for name in names {
            self.checks.push(CheckResult {
                name: (*name).to_string(),
                outcome: Outcome::Skip,
                detail: format!("skipped: {because}"),
            });
        }
        // A skipped check is a check that did not pass.
        self.passed = false;
    }

    /// The checks as text, one line each: `ok   create-idempotent: …`, then a summary line.
    pub fn lines(&self) -> Vec<String> {
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        let mut lines: Vec<String> = self
            .checks
            .iter()
            .map(|c| {
                let mark = match c.outcome {
                    Outcome::Pass => "ok  ",
                    Outcome::Fail => "FAIL",
                    Outcome::Skip => "skip",
                };
                format!("{mark} {:width$}  {}", c.name, c.detail)
            })
            .collect();
        let count = |o: Outcome| self.checks.iter().filter(|c| c.outcome == o).count();
        lines.push(format!(
            "{} {} {}: {} passed, {} failed, {} skipped",
            if self.passed { "PASS" } else { "FAIL" },
            self.plugin,
            self.version,
            count(Outcome::Pass),
            count(Outcome::Fail),
            count(Outcome::Skip)
        ));
        lines
    }

    /// The names of the checks that did not pass, for test failure messages.
    pub fn failures(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| c.outcome != Outcome::Pass)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_or_a_skip_fails_the_report_and_every_check_gets_a_line() {
        let mut report = Report::new("demo", "0.1.0");
        assert!(report.record("create", Ok("id px-1".into())));
        assert!(report.passed);
        assert!(!report.record("get-after-create", Err("owner differs".into())));
        report.skip(&["delete"], "create failed");
        assert!(!report.passed);
        let lines = report.lines();
        assert_eq!(lines[0], "ok   create            id px-1");
        assert_eq!(lines[1], "FAIL get-after-create  owner differs");
        assert_eq!(lines[2], "skip delete            skipped: create failed");
        assert_eq!(lines[3], "FAIL demo 0.1.0: 1 passed, 1 failed, 1 skipped");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["checks"][1]["outcome"], "fail");
        assert_eq!(json["passed"], false);
    }
}
