//! The conformance suite for providers (`proxy-operator plugin test`): does a component keep the
//! provider contract of docs/plugin-authoring.md? Pure verdicts in `checks` and `configs`, the
//! calls in `run`, the output in `report`.

mod checks;
mod configs;
pub mod reasons;
mod report;
mod run;

pub use reasons::{CHECK_REASONS, HOST_ONLY_REASONS, is_check_reason};
pub use report::{CheckResult, Outcome, Report};
pub use run::{Subject, default_spec, run};
